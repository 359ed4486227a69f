"""What the driver and the Ray workers both use: atomic file writes, the Ray address, shipping
code with a job and running one task per node. Imports nothing of the project's."""
