"""A real webhook receiver for the tests: an HTTP server on 127.0.0.1 that records every request
(headers lower-cased, raw body) and answers what the test scripts: a list of statuses to give in
turn (then 200), or a hold that keeps a request unanswered until released."""

import http.server
import threading

import pytest


class Receiver:
    def __init__(self):
        self.requests = []  # (headers dict, body bytes), in arrival order
        self.statuses = []  # answered in turn; 200 once used up
        self.hold = threading.Event()  # set: answer at once; clear: hang until set
        self.hold.set()
        self.arrived = threading.Condition()
        self.redirect_to = None
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get('Content-Length') or 0))
                with receiver.arrived:
                    receiver.requests.append(
                        ({k.lower(): v for k, v in self.headers.items()}, body)
                    )
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                    receiver.arrived.notify_all()
                receiver.hold.wait(120)
                self.send_response(status)
                if receiver.redirect_to:
                    self.send_header('Location', receiver.redirect_to)
                self.send_header('Content-Length', '0')
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.server.daemon_threads = True
        self.url = 'http://127.0.0.1:%d/hook' % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count, timeout=20.0):
        """The first ``count`` requests, once they have arrived."""
        with self.arrived:
            if not self.arrived.wait_for(lambda: len(self.requests) >= count, timeout):
                raise AssertionError('%d requests, wanted %d' % (len(self.requests), count))
            return list(self.requests[:count])

    def close(self):
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def make_receiver():
    made = []

    def make():
        made.append(Receiver())
        return made[-1]

    yield make
    for server in made:
        server.close()
