#!/usr/bin/env python3
"""A local stand-in for an OpenAI-compatible chat API, for the llm proposer's tests.

Serves POST /v1/chat/completions on 127.0.0.1 (a free port, written to --port-file once it
listens) with the replies of --replies, one per request, in order. Each reply is an object:

  status   HTTP status (default 200)
  body     a JSON value sent as the body, or
  raw      a text sent as the body as it is ("{auth}" in it becomes the request's
           Authorization header, to test that kforge masks a key a server echoes)
  headers  extra response headers, e.g. {"Retry-After": "0"}
  delay    seconds to wait before answering (a client timeout)
  repeat   how many requests this reply answers (default 1)

Every request is appended to --log as one JSON line (the Authorization header, the model, the
messages). A request past the last reply gets HTTP 400, which kforge does not retry.
"""
import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--replies", required=True)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()

    queue = []
    with open(args.replies) as f:
        for reply in json.load(f):
            queue.extend([reply] * int(reply.get("repeat", 1)))
    lock = threading.Lock()
    served = [0]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_):
            pass

        def do_POST(self):
            length = int(self.headers.get("Content-Length", 0))
            request = json.loads(self.rfile.read(length) or b"{}")
            auth = self.headers.get("Authorization", "")
            with lock:
                index = served[0]
                served[0] += 1
                with open(args.log, "a") as log:
                    log.write(json.dumps({"n": index + 1, "path": self.path,
                                          "authorization": auth,
                                          "model": request.get("model"),
                                          "messages": request.get("messages")}) + "\n")
            if not self.path.endswith("/chat/completions") or index >= len(queue):
                self.answer(400, json.dumps({"error": {"message": "no recorded reply left"}}), {})
                return
            reply = queue[index]
            time.sleep(float(reply.get("delay", 0)))
            if "raw" in reply:
                body = reply["raw"].replace("{auth}", auth)
            else:
                body = json.dumps(reply.get("body", {}))
            self.answer(int(reply.get("status", 200)), body, reply.get("headers", {}))

        def answer(self, status, body, headers):
            data = body.encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up waiting (a timeout test)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(args.port_file + ".tmp", args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
