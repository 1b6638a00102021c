"""A TCP relay on the host: listens on an address of the tier's pod network and carries each connection to a server
on 127.0.0.1 (the API server, for pods: e2e.podnet).

    python -m e2e.relay --listen 10.244.0.1:24003 --to 24003
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
from collections.abc import Sequence

from e2e.netns import carry

log = logging.getLogger(__name__)


async def relay(host: str, port: int, target: int) -> None:
    """Relays until SIGTERM or SIGINT."""
    what = f"{host}:{port} -> 127.0.0.1:{target}"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await carry((reader, writer), socket.socket(socket.AF_INET, socket.SOCK_STREAM), target, what)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await asyncio.start_server(handle, host, port)
    print(f"relaying {what}", flush=True)
    try:
        await stop.wait()
    finally:
        server.close()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not ADDRESS:PORT")
    return host, int(port)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.relay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", type=_address, required=True, metavar="ADDRESS:PORT")
    parser.add_argument("--to", type=int, required=True, metavar="PORT", help="a port on 127.0.0.1")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(relay(args.listen[0], args.listen[1], args.to))
    except OSError as exc:
        print(f"python -m e2e.relay: cannot listen on {args.listen[0]}:{args.listen[1]}: {exc.strerror}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
