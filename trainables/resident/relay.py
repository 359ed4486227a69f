"""A trial's side of the resident protocol (trainables/resident/messages.py): a resident run's
Tune trial submits its run to the sweep's group pool and passes its windows to Tune (``relay``);
a fresh run's trial has the pool close its idle groups first (``make_room``)."""

from __future__ import annotations

from trainables.resident.messages import RELAY_POLL_S, Failed, Window
from trainables.ticket import RunTicket

__all__ = ["ResidentRunError", "make_room", "relay"]


class ResidentRunError(RuntimeError):
    """A run that failed in its resident group; the message is the group's error text."""


def relay(ticket: RunTicket) -> None:
    """Submit the run to the sweep's group pool (``ticket.pool``; the ticket object itself, Ray
    pickles it) and pass its windows to Tune until it ends. A trial stopped by Tune stops
    polling (its actor ends), which the pool takes as a cancel."""
    import ray
    from ray import tune

    pool = ray.get_actor(ticket.pool)
    job = ray.get(pool.submit.remote(ticket))
    ended = False
    try:
        while not ended and not _stopping():
            for event in ray.get(pool.poll.remote(job, RELAY_POLL_S)):
                if isinstance(event, Window):
                    tune.report(event.metrics)
                elif isinstance(event, Failed):
                    raise ResidentRunError(event.error)
                else:  # Ended
                    ended = True
    finally:
        if not ended:
            pool.cancel.remote(job)


def make_room(pool_name: str, timeout_s: float = 60.0) -> None:
    """Close the sweep's idle resident groups, waiting up to ``timeout_s`` for their workers to
    leave: a fresh run is about to start and may need the resources they hold."""
    import ray

    ray.get(ray.get_actor(pool_name).close_idle.remote(timeout_s))


def _stopping() -> bool:
    """Whether Tune asked this trial to stop (its session's stop event; Tune sets it when it
    stops or reuses the trial's actor)."""
    try:
        from ray.train._internal.session import get_session

        session = get_session()
        return bool(session is not None and session.stop_event.is_set())
    except Exception:  # noqa: BLE001 - moved in another Ray: the pool's lease still cancels
        return False
