"""The loopback OpenAI-compatible server of ``long_calls.py``'s streamed scenario: asyncio, so
one process holds thousands of streams (10 000 and more: it raises its open-files limit). Every
POST is a streamed chat completion whose text (a flashcards JSON, valid for
flashcard_generation) comes in CHUNKS pieces over --seconds. ``GET /stats`` answers
{marker: epoch seconds at which the first piece of text was sent}, for each request whose body
named a marker (``long-calls-job-N``).

    python benchmarks/long_calls_server.py --port 8300 --seconds 10
"""

import argparse
import asyncio
import json
import re
import resource
import time

CHUNKS = 100
CARDS = {'cards': [{'question': 'Question %d?' % n, 'answer': 'Answer %d' % n} for n in range(30)]}
TEXT = json.dumps(CARDS)
MARKER = re.compile(rb'long-calls-job-\d+')


def pieces(text, count):
    size = -(-len(text) // count)
    return [text[i : i + size] for i in range(0, len(text), size)]


def chunk(delta, finish_reason=None):
    return {
        'id': 'chatcmpl-long-calls',
        'object': 'chat.completion.chunk',
        'created': 0,
        'model': 'long-calls',
        'choices': [{'index': 0, 'delta': delta, 'finish_reason': finish_reason}],
    }


class Server:
    def __init__(self, seconds):
        self.interval_s = seconds / CHUNKS
        self.first_sent = {}
        self.open_streams = 0
        self.most_streams = 0

    async def handle(self, reader, writer):
        try:
            head = await reader.readuntil(b'\r\n\r\n')
            length = re.search(rb'(?i)content-length:\s*(\d+)', head)
            body = await reader.readexactly(int(length.group(1))) if length else b''
            if head.startswith(b'GET /stats'):
                await self.reply_json(
                    writer, {'first_sent': self.first_sent, 'most_streams': self.most_streams}
                )
            else:
                await self.stream(writer, body)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def reply_json(self, writer, obj):
        data = json.dumps(obj).encode()
        writer.write(
            b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n'
            b'Connection: close\r\nContent-Length: %d\r\n\r\n' % len(data) + data
        )
        await writer.drain()

    async def stream(self, writer, body):
        marker = MARKER.search(body)
        usage = b'include_usage' in body
        writer.write(
            b'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n'
        )
        self.open_streams += 1
        self.most_streams = max(self.most_streams, self.open_streams)
        try:
            self.send(writer, chunk({'role': 'assistant', 'content': ''}))
            for number, piece in enumerate(pieces(TEXT, CHUNKS)):
                if number:
                    await asyncio.sleep(self.interval_s)
                self.send(writer, chunk({'content': piece}))
                await writer.drain()
                if number == 0 and marker:
                    self.first_sent[marker.group().decode()] = time.time()
            self.send(writer, chunk({}, 'stop'))
            if usage:
                self.send(
                    writer,
                    dict(
                        chunk({}),
                        choices=[],
                        usage={'prompt_tokens': 100, 'completion_tokens': 400, 'total_tokens': 500},
                    ),
                )
            writer.write(b'data: [DONE]\n\n')
            await writer.drain()
        finally:
            self.open_streams -= 1

    def send(self, writer, obj):
        writer.write(b'data: ' + json.dumps(obj).encode() + b'\n\n')


async def serve(port, seconds):
    server = Server(seconds)
    listener = await asyncio.start_server(server.handle, '127.0.0.1', port, backlog=16384)
    print('long_calls_server: listening on %d' % port, flush=True)
    async with listener:
        await listener.serve_forever()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--port', type=int, required=True)
    parser.add_argument('--seconds', type=float, default=10.0)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(serve(args.port, args.seconds))


if __name__ == '__main__':
    main()
