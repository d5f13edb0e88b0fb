"""Trampoline kernel entry point: like `python -m ipykernel_launcher -f CONN`, but the main loop
may stop for a fork at a cell boundary and be restarted (parent) or replaced (child)."""
import sys

sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
import spikefork  # noqa: E402
from ipykernel.kernelapp import IPKernelApp  # noqa: E402
from tornado.ioloop import IOLoop  # noqa: E402

app = IPKernelApp.instance()
app.initialize(sys.argv[1:])
IOLoop.current().add_callback(spikefork.record_machinery)  # runs once the loop is up
app.start()
while True:
    req = spikefork.take_pending()
    if req is None:
        break  # shutdown
    role = spikefork.do_fork(app, req)
    # parent: same loop, restarted; child: a new loop (made current by do_fork)
    IOLoop.current().start()
