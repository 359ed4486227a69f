"""platform/execution/signals.py's start-up handlers (issue 54 item 5), in this process."""

import os
import signal
import threading

import pytest

from platform.execution.signals import StartUpInterrupted, start_up_signals


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_signal_in_the_start_up_raises_even_where_sigint_was_inherited_ignored(sig, code):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a script's background job
    try:
        with pytest.raises(StartUpInterrupted) as stop, start_up_signals():
            os.kill(os.getpid(), sig)
            threading.Event().wait(5)  # the handler runs at the next bytecode
        assert stop.value.name == signal.Signals(sig).name and stop.value.exit_code == code
        assert isinstance(stop.value, KeyboardInterrupt)  # the CLIs' except clause
        # The handlers before are back once the start-up is over (Tune's loop takes them).
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
