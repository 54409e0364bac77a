"""os-ken 4.2 native-hub defects, reproduced, and contained by `controller.southbound.compat`.

Each case runs in a fresh interpreter (os-ken keeps process-wide singletons, and the patches are global):
once without the compatibility module, to show the defect is real in the installed os-ken (if an upgrade
fixes it, the canary fails and the workaround can go), and once with it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

HANDLER_RAISES = """
import sys, threading, time
from os_ken.base import app_manager
from os_ken.controller import event, handler
if sys.argv[1] == "patched":
    from controller.southbound import compat
    compat.install()

class Ping(event.EventBase):
    pass

class App(app_manager.OSKenApp):
    seen = []
    @handler.set_ev_cls(Ping)
    def on_ping(self, ev):
        App.seen.append(ev)
        if len(App.seen) == 1:
            raise RuntimeError("a bug in a handler")

app = App()
app_manager.register_app(app)
app.start()
for _ in range(3):
    app._send_event(Ping(), None)
deadline = time.monotonic() + 3  # a slow machine gets time; a dead loop never reaches 3
while len(App.seen) < 3 and time.monotonic() < deadline:
    time.sleep(0.05)
time.sleep(0.3)
print(len(App.seen), flush=True)
import os; os._exit(0)  # raw hub threads are not daemons
"""

DISCONNECTS = """
import socket, sys, threading, time
from os_ken import cfg
from os_ken.base import app_manager
from os_ken.controller import controller, handler
if sys.argv[1] == "patched":
    from controller.southbound import compat
    compat.install()
cfg.CONF(args=[], project="os_ken", default_config_files=[])
deaths = []
before = threading.active_count()
listener = socket.create_server(("127.0.0.1", 0))
for _ in range(20):
    switch = socket.create_connection(listener.getsockname())
    ours, _ = listener.accept()
    dp = controller.Datapath(ours, ("switch", 1))
    orig = dp.set_state
    def set_state(state, orig=orig):
        if state == handler.DEAD_DISPATCHER:
            deaths.append(1)
        orig(state)
    dp.set_state = set_state
    def serve(dp=dp):
        try:
            dp.serve()
        finally:
            dp.close()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    switch.recv(8)  # the controller's HELLO
    switch.close()  # the switch goes away
    t.join(3 if sys.argv[1] == "patched" else 0.1)
time.sleep(0.5)
print(threading.active_count() - before, len(deaths), flush=True)
import os; os._exit(0)
"""


def run(script: str, mode: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), mode],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[-2:] if " " in result.stdout.strip() else result.stdout.split()[-1:]


def test_unpatched_hub_stops_an_apps_event_loop_after_one_handler_exception() -> None:
    assert run(HANDLER_RAISES, "raw") == ["1"]  # events 2 and 3 never handled


def test_patched_hub_keeps_handling_events_after_a_handler_exception() -> None:
    assert run(HANDLER_RAISES, "patched") == ["3"]


def test_unpatched_disconnects_leak_threads_and_never_report_death() -> None:
    leaked, deaths = map(int, run(DISCONNECTS, "raw"))
    assert leaked >= 20 and deaths == 0


def test_patched_disconnects_end_their_threads_and_report_death() -> None:
    leaked, deaths = map(int, run(DISCONNECTS, "patched"))
    assert deaths == 20
    assert leaked <= 2  # echo threads sleep out their interval as daemons; nothing accumulates per cycle
