"""How runs start: the cluster, inputs, resources and placement, the Tuner, signals, node checks
and resume."""
