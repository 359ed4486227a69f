"""The race's warm start (platform/control/race.py's ``Race`` inherits ``WarmStart``): what
the machine's catalogue decides in a race on a host fingerprint seen before.

Priors (a warm start, platform/analysis/priors.py: ``race_priors``). On a host fingerprint seen
before, a group may come with what the catalogue measured of the same configuration there: its
earlier runs, their windows after the warm-up and their tail figures. What the race does with
them is the sweep's history mode (``--history``, kept in the schedule's ``history``):

``confirm`` (the default). The catalogue's runs of a group stand in for its repeats once this
host confirms them: when the group has ``confirm_windows`` clean windows here, their mean over
the catalogue's mean must fall in the prior's band (``Priors.confirms``: a prediction band of a
new run's first windows from the catalogue alone, the run-to-run spread pooled over the priors,
the group's window spread there and ``noise_floor``; few windows here never widen it). Inside,
the group settles (``settled``): its run going stops there, its later repeats are not run
(``skipped``: its catalogue runs stand in), the Phase B limits judge its runs here and its
catalogue runs together (unstable over them, it leaves as unstable instead), and it is a
reference for the groups still racing, its bounds over those pooled runs. The sweep's ranking
pools the same runs and says so (platform/analysis/pooled.py). Outside the band, the prior is
dropped for good and the group runs as cold, every repeat: a host that changed since (clocks, a
noisy neighbour) is caught per group. A change every group shares, small enough to fall inside
each band alone, is caught across them (``_check_shift``: once two or more groups were judged,
the median of their ratios must lie within ``shift_tolerance`` of 1, else every prior is dropped
and the settled groups un-settled, in one line). Within it, that median (``host_shift``; one
judged group's own ratio) is the level this host shows against the catalogue today, and the
catalogue runs are scaled by it wherever they count as measured here: a settled group's pooled
bounds (its catalogue windows' samples/s x the factor), its Phase B checks (their iter p50 /
the factor) and the ranking (platform/analysis/pooled.py); unscaled, a host 2.5 % slower today
would rank a settled group up to 2.5 % above a group that raced cold. The factor at each
decision is kept (a settled prior's ``scale``, an elimination on pooled figures' ``scale``), the
latest in the schedule's ``history``' ``scale``, which the ranking and ``--resume`` read. The
band test itself stays on the unscaled catalogue: it is what measures the shift. A settled
group never ranks on its catalogue runs alone: when the run that confirmed it fails, or ends
before its stop was told (or, on --resume, was recorded), it is un-settled (``_unsettle``: its
prior dropped, its repeats handed out again). A prior the sweep cannot pool (runs of another or an unknown platform
commit, or an unknown corpus: ``order_only``) is used as ``order`` uses it. A
settled group is never stopped as slower; its pooled figures rank it. Every point still runs
here, as in a cold race (no point is ranked on the catalogue alone), but only as long as it
takes to tell that the host still measures what it measured before.

``order``. The priors decide what stops early and nothing else: the bounds, the Phase B checks,
the ranking and the winner use the sweep's own windows alone. The prior leader is the steady
group in the race with the highest prior mean whose prior was not dropped; a group within noise
of it in the catalogue (``Priors.versus``: the band of ``platform.catalogue compare``, holding
1) races as it would cold and runs its repeats. A group the catalogue measured clearly slower
than it (the band under 1) is judged once it and the leader have ``confirm_windows`` clean
windows here: its ratio here is the median of its first ones over the median of the leader's
clean windows so far. It agrees when that ratio is no higher than the catalogue's band allows
(the group is no closer to the leader here than measured before; slower still agrees): the
group is stopped as slower ``by`` the leader, its verdict marked ``prior``. Higher, the prior
is dropped (for good) and the group races cold. The ratio, not the group's own figure, is
compared so that a host running a few percent slower or faster than on the catalogue's day
(benchmarks/results/warm_race_2xh200/: every group 1-3 % slower in race 2) moves both sides
alike. A prior leader that leaves the race unstable or failed lets back the groups it stopped
this way, as any leader does; their priors are judged again against the next one.

Each group's prior, its state (held, confirmed or dropped; in ``order`` held, agreed or
dropped), the catalogue runs it holds and what it decided are in the schedule's ``priors``.
"""

from __future__ import annotations

import statistics
from typing import Any

from platform.analysis.priors import Priors, host_shift

__all__ = ["WarmStart"]

_UNJUDGED = "not judged here"  # a prior's line before the race used it


class WarmStart:
    """The priors' part of ``Race``: held in the schedule, judged against this host's first
    windows, settled, un-settled, the shared shift and the scale (the module docstring). It
    works on the race's state (``schedule``, ``plan``, ``groups``, ``windows``, ...) and
    decides through its ``_eliminate``, ``_readmit``, ``_stop`` and ``echo``."""

    def _hold_priors(self, priors: Priors) -> None:
        """Each group's prior into the schedule (``priors``: its figures, the catalogue runs it
        holds, held until judged here; a resumed sweep's as its first attempt left them) and
        the mode and noise (``history``): what the analysis pools and ``--resume`` rebuilds (a
        resumed race keeps what its ``history`` holds besides: the shift, the scale)."""
        before = self.schedule.state.get("priors") or {}
        held = {}
        for group in self.groups:
            prior = priors.groups.get(group)
            if prior is None:
                continue
            held[group] = before.get(group) or {
                "state": "held",
                "catalogue": prior.describe(),
                "mean": prior.mean,
                "runs": len(prior.runs),
                "windows": len(prior.windows),
                "sweeps": list(prior.sweeps),
                "jittery": prior.jittery,
                "line": _order_line(prior.order_only, _UNJUDGED),
                "order_only": prior.order_only,
                "catalogue_runs": [r.record() for r in prior.runs],
            }
        if held:
            self.schedule.state["priors"] = held
            kept = self.schedule.state.get("history") or {}
            self.schedule.state["history"] = {**kept, "mode": self.history, **priors.record()}
            self.schedule.save()

    def _prior_leader(self) -> str | None:
        """The steady group in the race with the highest prior mean, its prior not dropped."""
        held = [
            g for g, r in self.prior_state.items()
            if g not in self.eliminated and r["state"] != "dropped" and not r.get("jittery")
        ]  # fmt: skip
        return max(held, key=lambda g: self.prior_state[g]["mean"]) if held else None

    def _judge(self) -> None:
        """What a clean window or a run's end may decide: with ``confirm`` priors, those first
        (a group settled on its confirmed prior is a reference and is never stopped as
        slower, so it settles before the bounds judge it), then the bounds; else the bounds,
        then the priors."""
        if self.history == "confirm":
            self._decide_prior()
            self._decide()
        else:
            self._decide()
            self._decide_prior()

    def _decide_prior(self) -> None:
        """The priors' decisions, by the history mode: ``confirm`` (``_confirm_priors``) or
        ``order`` (``_stop_on_priors``)."""
        if self.priors is None:
            return
        if self.history == "confirm":
            self._confirm_priors()
            if any(r.get("order_only") for r in self.prior_state.values()):
                self._stop_on_priors()  # the priors it cannot pool, as --history order
        else:
            self._stop_on_priors()

    def _confirm_priors(self) -> None:
        """``--history confirm``: each held prior whose group has ``confirm_windows`` clean
        windows here is judged on their mean over its catalogue mean (``Priors.confirms``).
        Inside the band, the group settles (``_settle``); outside, its prior is dropped for
        good and it runs as cold, every repeat."""
        if (self.schedule.state.get("history") or {}).get("shift"):
            return  # every prior dropped (``_check_shift``)
        k = self.plan.confirm_windows
        for group, record in self.prior_state.items():
            if record["state"] != "held" or group in self.eliminated or record.get("order_only"):
                continue
            if group not in self.priors.groups:
                continue
            mine = self._clean(group)[:k]
            if len(mine) < k:
                continue
            ratio, low, high = self.priors.confirms(group, [w["samples_per_s"] for w in mine])
            prior = self.priors.groups[group]
            at = f"its first {k} judged window(s) here (to step {mine[-1]['step']})"
            band = (f"{ratio:.3f}x its catalogue runs' first {k} judged windows "
                    f"({prior.first_mean(k):.1f} samples/s; band {low:.3f}-{high:.3f})")  # fmt: skip
            if low <= ratio <= high:
                self._settle(group, record, f"{at} put it at {band}", ratio)
                continue
            record.update(state="dropped", here=ratio, line=(
                f"dropped: {at} put it at {band}; it ran as cold, every repeat"))  # fmt: skip
            self._rescale()
            self.schedule.save()
            self.echo(f"race: group {group}: catalogue prior dropped: {at} put it at {band}; it "
                      "runs as cold, every repeat")  # fmt: skip
        self._check_shift()

    def _check_shift(self) -> None:
        """The shift every group shares: once two or more groups were judged against their
        priors (confirmed or dropped), the median of their ratios here over the catalogue must
        lie within ``shift_tolerance`` of 1 (3 %: the same host measured the same groups 1-3 %
        apart from one race to the next, benchmarks/results/warm_race_2xh200, and a median of
        two or three groups' first windows is no closer than that; a tighter tolerance would
        send most warm races on an unchanged host cold, a looser one would pool runs of a host
        that changed. Within it, the catalogue runs are scaled by the shift wherever they are
        pooled, ``_rescale``, so the pooled groups sit at this host's level, as the groups
        that race cold do). Outside it, this host measures differently from the
        catalogue's day as a whole (clocks, a driver, a neighbour: every group 5 % slower fits
        inside each group's own band, and would pool runs of two hosts): every prior is
        dropped, the settled groups un-settled, and every group races cold, said in one line
        (kept in the schedule's ``history``' ``shift``)."""
        kept = self.schedule.state.get("history") or {}
        if kept.get("shift"):
            return
        shift, judged = host_shift(self.prior_state)
        if judged < 2:
            return
        tolerance = self.plan.shift_tolerance
        if abs(shift - 1) <= tolerance:
            return
        line = (f"catalogue priors dropped: the {judged} group(s) judged so far put this "
                f"host at {shift:.3f}x their catalogue runs' (median), outside the shift "
                f"tolerance (+-{tolerance:.0%}): the host measures differently from the catalogue's day as a "
                "whole; every group races cold, every repeat")  # fmt: skip
        kept["shift"] = line
        self.schedule.state["history"] = kept
        for group, record in self.prior_state.items():
            if record["state"] == "confirmed":
                self._unsettle(group, f"the shift every group shares ({shift:.3f}x)", say=False)
            elif record["state"] == "held":
                record.update(state="dropped", line=f"dropped: the shift every group shares "
                              f"({shift:.3f}x); it ran as cold, every repeat")  # fmt: skip
        self.schedule.save()
        self.echo(f"race: {line}")

    def _settle(self, group: str, record: dict[str, Any], why: str, ratio: float) -> None:
        """A confirmed prior: the group's runs going stop here, its later repeats are not run
        (``runnable``), its catalogue runs stand in for them, in the Phase B checks at once and
        in the ranking (platform/analysis/pooled.py). Unstable over those pooled runs, it
        leaves the race as unstable instead."""
        prior = self.priors.groups[group]
        going = [
            r for r in self.groups[group] if r in self.running and r not in self.schedule.stops
        ]
        steps = [self.windows[r][-1]["step"] for r in going if self.windows.get(r)]
        stop = f"stopped at step {steps[0]}" if steps else "no run going"
        stands = (f"its {len(prior.runs)} catalogue run(s) (sweep(s) {', '.join(prior.sweeps)}) "
                  "stand in for its repeats, pooled in the ranking")  # fmt: skip
        record.update(state="confirmed", here=ratio, line=f"confirmed: {why}; {stop}; {stands}")
        record["scale"] = self._rescale()  # its pooled figures' factor, as it settled
        self._check_unstable(group)
        if group in self.eliminated:  # its run was stopped as unstable
            record["line"] += "; then left the race as unstable over those runs"
            self.schedule.save()
            return
        for run in going:
            self._stop(run, f"prior confirmed: {why}; {stands}")
        self.schedule.save()
        self.echo(f"race: group {group}: catalogue prior confirmed: {why}; {stop}, {stands}")

    def _rescale(self) -> float:
        """The shift this host shows now (``host_shift`` over the groups judged so far),
        kept in the schedule's ``history`` as ``scale`` (its ``factor`` and the groups it is
        the median of, ``judged``): the factor the catalogue runs are scaled by wherever they
        count as measured here, in the race and in the ranking (the module docstring)."""
        factor, judged = host_shift(self.prior_state)
        kept = self.schedule.state.setdefault("history", {})
        kept["scale"] = {"factor": factor, "judged": judged}
        return factor

    def _unsettle(self, group: str, why: str, say: bool = True) -> None:
        """A settled group whose prior no longer stands: it lost the run that confirmed it
        (failed, or interrupted before its stop was told or recorded; with no measured run
        here its catalogue runs would stand in for every run), or the shift every group
        shares dropped every prior. Its prior is dropped and it races cold: a stop not told
        yet is taken back (an interrupted run runs again on --resume), a run told its stop
        stays stopped (its windows count as a cold race's would), and the repeats the prior
        skipped are handed out again; the groups it knocked out as slower on its pooled bounds
        come back (``_readmit``). ``say``: its own line (the shift says one for all)."""
        record = self.prior_state[group]
        stops, skipped = self.schedule.stops, self.schedule.state["skipped"]
        for run in self.groups[group]:
            reason = str(stops.get(run, {}).get("reason", ""))
            if reason.startswith("prior confirmed") and run not in self.told:
                del stops[run]
        runs = [r for r in self.groups[group] if r in skipped and "catalogue runs stand in"
                in skipped[r]]  # fmt: skip
        for run in runs:
            del skipped[run]
        self.again = sorted({*self.again, *runs}, key=self.order.__getitem__)
        record.update(state="dropped", line=f"{record['line']}; then un-settled: {why}; it "
                      "raced cold, every repeat")  # fmt: skip
        self.schedule.save()
        if say:
            self.echo(f"race: group {group}: catalogue prior dropped: {why}; it runs as cold, "
                      "every repeat")  # fmt: skip
        # What it knocked out as slower on bounds pooled with its catalogue runs comes back,
        # judged again against the references still valid.
        self._readmit(group, f"{group}'s catalogue prior was dropped ({why})")

    def _stop_on_priors(self) -> None:
        """``--history order``: each held prior of a group the catalogue measured clearly
        slower than the prior leader, once both have ``confirm_windows`` clean windows here:
        the group's first ones' median over the leader's clean windows' median is its ratio
        here. No higher than the catalogue's band of their ratio allows, it agrees and the
        group is stopped; higher, its prior is dropped and it races cold. In ``confirm``, the
        priors it cannot pool (``order_only``) alone, each line saying why."""
        confirm = self.history == "confirm"
        leader = self._prior_leader()
        k = self.plan.confirm_windows
        lead = [w["samples_per_s"] for w in self._clean(leader)] if leader else []
        if len(lead) < k:
            return
        ahead = self.prior_state[leader]
        if (
            ahead["state"] == "held"
            and not ahead.get("leads")
            and (not confirm or ahead.get("order_only"))
        ):
            said = "the prior leader: runs its repeats"
            ahead.update(leads=True, line=_order_line(ahead.get("order_only"), said)
                         if ahead["line"].endswith(_UNJUDGED) else f"{ahead['line']}; then {said}")  # fmt: skip
        for group, record in self.prior_state.items():
            mine = self._clean(group)[:k]
            if group == leader or group in self.eliminated or record["state"] != "held":
                continue
            why = record.get("order_only")
            if confirm and not why:
                continue
            ratio, low, high = self.priors.versus(group, leader)
            band = f"{ratio:.2f}x in the catalogue (band {low:.2f}-{high:.2f})"
            if high >= 1.0:  # within noise of the leader there: its repeats run
                if record["line"].endswith(_UNJUDGED):
                    record["line"] = _order_line(
                        why, f"within noise of the leader {leader}: {band}; runs its repeats"
                    )
                continue
            if len(mine) < k:
                continue
            here = statistics.median(w["samples_per_s"] for w in mine) / statistics.median(lead)
            at = f"its first {k} judged window(s) here (to step {mine[-1]['step']})"
            if here > high:
                record.update(state="dropped", here=here, line=_order_line(why, (
                    f"dropped: {at} put it at {here:.2f}x the leader {leader}, above {band}; "
                    "raced cold")))  # fmt: skip
                self.schedule.save()
                self.echo(f"race: group {group}: catalogue prior dropped ({at}: {here:.2f}x the "
                          f"leader {leader}, above {band}); it races cold")  # fmt: skip
                continue
            steps = [self.windows[r][-1]["step"] for r in self.groups[group]
                     if r in self.running and self.windows.get(r)]  # fmt: skip
            stop = f"stopped at step {steps[0]}" if steps else "stopped before its next repeat"
            reason = f"{stop}: {here:.2f}x the leader here and {band}; {at} agree"
            record.update(state="agreed", here=here,
                          line=_order_line(why, f"agreed; {reason} (leader {leader})"))  # fmt: skip
            self._eliminate(group, "slower", reason, by=leader, prior=True)


def _order_line(why: str | None, line: str) -> str:
    """A prior's line; for one ``--history confirm`` cannot pool (``why``), saying so first."""
    return f"as --history order, never pooled ({why}): {line}" if why else line
