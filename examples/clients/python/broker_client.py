"""A minimal slotbroker fylr-side client in Python, written against stubs generated
from proto/slotbroker/v1/broker.proto.

Generate the stubs, then run it against an execserver:

    python -m grpc_tools.protoc -I proto --python_out=OUT --grpc_python_out=OUT \
        proto/slotbroker/v1/broker.proto
    PYTHONPATH=OUT python examples/clients/python/broker_client.py 127.0.0.1:7600 cat hello

It opens one broker stream, waits for HELLO, parks a WANT, accepts the OFFER with a JOB
(the remaining arguments are appended to the service's command) and prints the DONE
receipt as JSON. Set SLOTBROKER_TOKEN when the execserver has a token.
"""

import json
import os
import queue
import sys
import uuid

import grpc
from google.protobuf import json_format

from slotbroker.v1 import broker_pb2, broker_pb2_grpc


def run_one_job(address, service, args, token=None, timeout=30.0):
    """Runs one job through the broker and returns its Receipt."""
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

    with grpc.insecure_channel(address) as channel:
        stub = broker_pb2_grpc.BrokerServiceStub(channel)
        responses = stub.Connect(requests(), metadata=metadata, timeout=timeout)
        job_id = uuid.uuid4().hex
        try:
            for response in responses:
                kind = response.WhichOneof("frame")
                if kind == "hello":
                    if service not in response.hello.services:
                        raise SystemExit(f"execserver {response.hello.instance_id} does not offer {service!r}")
                    outgoing.put(broker_pb2.ConnectRequest(want=broker_pb2.Want(job_id=job_id, service=service)))
                elif kind == "offer" and response.offer.job_id == job_id:
                    spec = broker_pb2.JobSpec(args=args)
                    job = broker_pb2.Job(job_id=job_id, offer_token=response.offer.offer_token, spec=spec)
                    outgoing.put(broker_pb2.ConnectRequest(job=job))
                elif kind == "done" and response.done.job_id == job_id:
                    return response.done.receipt
                elif kind == "reject":
                    raise SystemExit(f"rejected: {response.reject.message}")
                # Anything else (a re-sent HELLO, a frame kind added later) is skipped.
        finally:
            outgoing.put(None)
    raise SystemExit("stream ended before DONE")


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    receipt = run_one_job(argv[1], argv[2], argv[3:], token=os.environ.get("SLOTBROKER_TOKEN"))
    print(json.dumps(json_format.MessageToDict(receipt)))
    return 0 if receipt.HasField("exit_code") and receipt.exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
