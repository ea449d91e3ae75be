"""A loopback HTTP/1.1 server that answers each request with the bytes a test scripts (the
chat call's transport tests: tests/features/gateway/)."""

import socket
import ssl
import threading


class ScriptedServer:
    """Answers the n-th request with ``answers[n]`` (bytes); after an answer, closes the
    connection when ``close_after`` says so; after the last, closes it unless ``hold``. Counts
    the connections it accepted."""

    def __init__(self, answers, close_after=False, hold=False, tls=None):
        self.answers = list(answers)
        self.close_after = close_after
        self.hold = hold
        self.connections = 0
        self.requests = []
        self.listener = socket.create_server(('127.0.0.1', 0))
        port = self.listener.getsockname()[1]
        self.url = 'http://127.0.0.1:%d/v1/chat/completions' % port
        if tls is not None:  # a server-side SSLContext
            self.listener = tls.wrap_socket(self.listener, server_side=True)
            self.url = 'https://localhost:%d/v1/chat/completions' % port
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except ssl.SSLError:
                continue  # a client that refused our certificate
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        reader = conn.makefile('rb')
        with conn:
            while self.answers:
                head = b''
                while not head.endswith(b'\r\n\r\n'):
                    line = reader.readline()
                    if not line:
                        return
                    head += line
                length = int(head.lower().split(b'content-length:')[1].split(b'\r\n')[0])
                self.requests.append((head, reader.read(length)))
                conn.sendall(self.answers.pop(0))
                if self.close_after:
                    return
            if self.hold:
                reader.read()  # until the client closes

    def close(self):
        self.listener.close()
