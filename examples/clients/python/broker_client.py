"""Runs one command on a slotbroker execserver, like a remote shell without the shell.

A minimal fylr-side client written against stubs generated from
proto/slotbroker/v1/broker.proto (see README.md for the exact setup). From this directory:

    echo hello | PYTHONPATH=gen .venv/bin/python broker_client.py 127.0.0.1:7600 sha256sum

It opens one broker stream, waits for HELLO, parks a WANT, answers the OFFER with a JOB
whose stdin and stdout are one-time URLs it serves itself (its own stdin is the job's
stdin), waits for DONE, writes the job's output to stdout and exits with the job's exit
code. Remaining arguments are appended to the service's command (the execserver decides
the executable). Set SLOTBROKER_TOKEN when the execserver has a token, and
SLOTBROKER_CA_FILE (its certificate's CA) when it serves TLS, plus SLOTBROKER_CERT_FILE and
SLOTBROKER_KEY_FILE when it asks for a client certificate (mTLS). Problems with the call
itself (no such service, a refused token, no execserver) exit 2 with one line on stderr.
"""

import http.server
import os
import queue
import secrets
import shutil
import sys
import tempfile
import threading

import grpc

from slotbroker.v1 import broker_pb2, broker_pb2_grpc


class CallError(Exception):
    """The call could not be made: exit 2 with this message."""


class Pipes:
    """Serves one stdin URL and one stdout URL, each exactly once, on 127.0.0.1."""

    def __init__(self, stdin_bytes, host):
        self.output = tempfile.SpooledTemporaryFile(max_size=8 << 20)
        self.output_complete = False
        in_id, out_id = secrets.token_hex(16), secrets.token_hex(16)
        used = set()
        pipes = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path != f"/in/{in_id}" or "in" in used:
                    return self.send_error(404 if self.path != f"/in/{in_id}" else 410)
                used.add("in")
                self.send_response(200)
                self.send_header("Content-Length", str(len(stdin_bytes)))
                self.end_headers()
                try:
                    self.wfile.write(stdin_bytes)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the process stopped reading its stdin early: its business, not an error

            def do_PUT(self):
                if self.path != f"/out/{out_id}" or "out" in used:
                    return self.send_error(404 if self.path != f"/out/{out_id}" else 410)
                used.add("out")
                try:
                    read_chunked(self.rfile, pipes.output)
                except (ValueError, OSError) as err:
                    # No final chunk: the job failed mid-stream. Never take it as short output.
                    return self.send_error(400, f"upload broke off: {err}")
                pipes.output_complete = True
                self.send_response(204)
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        base = f"http://{host}:{self.server.server_address[1]}"
        self.stdin_url, self.stdout_url = f"{base}/in/{in_id}", f"{base}/out/{out_id}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def read_chunked(rfile, sink):
    """Copies a chunked request body (what the execserver sends) into sink; raises when cut."""
    while True:
        line = rfile.readline(1024)
        if not line.endswith(b"\r\n"):
            raise ValueError("connection closed inside the body")
        size = int(line.split(b";", 1)[0], 16)
        if size == 0:
            rfile.readline(1024)  # the empty line after the last chunk (no trailers are sent)
            return
        data = rfile.read(size)
        if len(data) != size or rfile.read(2) != b"\r\n":
            raise ValueError("connection closed inside a chunk")
        sink.write(data)


def open_channel(address):
    """Plaintext without SLOTBROKER_CA_FILE; TLS verified against it with one, presenting
    SLOTBROKER_CERT_FILE/SLOTBROKER_KEY_FILE as the client certificate when they are set."""
    ca_file = os.environ.get("SLOTBROKER_CA_FILE")
    if not ca_file:
        return grpc.insecure_channel(address)

    def read(name):
        path = os.environ.get(name)
        if not path:
            return None
        with open(path, "rb") as f:
            return f.read()

    credentials = grpc.ssl_channel_credentials(
        root_certificates=read("SLOTBROKER_CA_FILE"),
        private_key=read("SLOTBROKER_KEY_FILE"),
        certificate_chain=read("SLOTBROKER_CERT_FILE"),
    )
    return grpc.secure_channel(address, credentials)


def run_one_job(address, service, args, stdin_bytes, token=None, timeout=60.0):
    """Runs one job through the broker; returns its Receipt and the Pipes that served it."""
    metadata = [("slotbroker-client", "python-example")]
    if token:
        metadata.append(("authorization", f"Bearer {token}"))
    outgoing = queue.Queue()

    def requests():
        while True:
            frame = outgoing.get()
            if frame is None:
                return
            yield frame

    with open_channel(address) as channel:
        stub = broker_pb2_grpc.BrokerServiceStub(channel)
        responses = stub.Connect(requests(), metadata=metadata, timeout=timeout)
        job_id = secrets.token_hex(8)
        pipes = None
        try:
            for response in responses:
                kind = response.WhichOneof("frame")
                if kind == "hello" and pipes is None:
                    hello = response.hello
                    if service not in hello.services:
                        offered = ", ".join(sorted(hello.services))
                        raise CallError(f"execserver {hello.instance_id} does not offer {service!r} (it offers: {offered})")
                    # The execserver reaches us at the address it sees us come from.
                    pipes = Pipes(stdin_bytes, hello.peer_address.rsplit(":", 1)[0].strip("[]") or "127.0.0.1")
                    outgoing.put(broker_pb2.ConnectRequest(want=broker_pb2.Want(job_id=job_id, service=service)))
                elif kind == "offer" and response.offer.job_id == job_id:
                    spec = broker_pb2.JobSpec(args=args, stdin_url=pipes.stdin_url, stdout_url=pipes.stdout_url)
                    job = broker_pb2.Job(job_id=job_id, offer_token=response.offer.offer_token, spec=spec)
                    outgoing.put(broker_pb2.ConnectRequest(job=job))
                elif kind == "offer_expired" and response.offer_expired.job_id == job_id:
                    # We answered too late: the want is gone, so park it again.
                    outgoing.put(broker_pb2.ConnectRequest(want=broker_pb2.Want(job_id=job_id, service=service)))
                elif kind == "done" and response.done.job_id == job_id:
                    return response.done.receipt, pipes
                elif kind == "reject":
                    raise CallError(f"execserver rejected the {response.reject.job_id or 'frame'}: {response.reject.message}")
                # Anything else (a re-sent HELLO, a frame kind added later) is skipped.
        except grpc.RpcError as err:
            raise CallError(explain(err)) from None
        finally:
            outgoing.put(None)
    raise CallError("the execserver ended the stream before DONE")


def explain(err):
    """One line a user can act on, for a failed call."""
    code = err.code()
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return f"the execserver refused the token (UNAUTHENTICATED): set SLOTBROKER_TOKEN to its token ({err.details()})"
    if code == grpc.StatusCode.UNAVAILABLE:
        return f"cannot reach the execserver (UNAVAILABLE): {err.details()}"
    return f"{code.name}: {err.details()}"


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    stdin_bytes = b"" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.buffer.read()
    try:
        receipt, pipes = run_one_job(argv[1], argv[2], argv[3:], stdin_bytes, token=os.environ.get("SLOTBROKER_TOKEN"))
    except CallError as err:
        print(f"broker_client.py: {err}", file=sys.stderr)
        return 2
    try:
        if receipt.stdout_streamed:
            if not pipes.output_complete:
                print("broker_client.py: the job's output upload did not complete", file=sys.stderr)
                return 1
            pipes.output.seek(0)
            shutil.copyfileobj(pipes.output, sys.stdout.buffer)
        else:
            sys.stdout.buffer.write(receipt.stdout_prefix)
        sys.stdout.flush()
    finally:
        pipes.close()
    if receipt.error or not receipt.HasField("exit_code"):
        kind = broker_pb2.ErrorKind.Name(receipt.error)
        print(f"broker_client.py: job failed: {kind}: {receipt.error_message or receipt.stderr_line}", file=sys.stderr)
        return 1
    if receipt.exit_code != 0 and receipt.stderr_line:
        print(receipt.stderr_line, file=sys.stderr)
    return receipt.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
