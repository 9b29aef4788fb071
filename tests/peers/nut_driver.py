"""A stand-in UPS driver for the real upsd: speaks upsd's driver socket protocol, offers the
instant commands a test asks for, and plays battery tests.

Why: Debian's dummy-ups (NUT 2.8.0) offers one instant command, ``load.off``, and upsd
answers ``ERR CMD-NOT-SUPPORTED`` to any other before it looks at the user's rights (checked
by hand: ``LIST CMD`` lists ``load.off`` alone). A battery test, and whether upsd lets a user
send one, need a driver that offers ``test.battery.start.quick``. This one listens where
upsd looks for dummy-ups (``<statepath>/dummy-ups-<name>``), so ``ups.conf`` keeps
``driver = dummy-ups`` and upsd is exactly the one the other tests run; only the hardware
behind the driver is played.

The protocol (NUT's docs/sock-protocol.txt), as upsd 2.8.0 speaks it: upsd sends
``DUMPALL`` on connecting (the driver answers every ``SETINFO``, ``ADDCMD``, ``DATAOK``,
then ``DUMPDONE``), ``PING`` (``PONG``), ``INSTCMD name [value]`` and
``SET var "value"``; the driver sends ``SETINFO`` whenever a value changes.

A battery test (``test.battery.start.quick`` or ``.deep``) puts the UPS on battery
(``OB DISCHRG``, with ``CAL`` for a deep test), ``ups.test.result`` to ``In progress``, the
charge down a percent a second for a deep test, and after ``--test-seconds`` back on line
with ``ups.test.result`` ``Done and passed`` (``--test-result`` for another);
``test.battery.stop`` ends it ``Aborted by user``. Every command received is written, one a
line, to the ``--log`` file. A new data file (``NutServer.write``) is played as the UPS's
values from then on, as dummy-ups plays it.

Run by hand: ``python -m tests.peers.nut_driver --socket PATH --data FILE --command ...``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path

DRIVER_COMMANDS = (
    "test.battery.start.quick",
    "test.battery.start.deep",
    "test.battery.stop",
    "shutdown.return",
    "load.off",
)


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def read_values(path: Path) -> dict[str, str]:
    values = {}
    for line in path.read_text().splitlines():
        name, _, value = line.partition(":")
        if name.strip() and not name.startswith("#"):
            values[name.strip()] = value.strip()
    return values


class Driver:
    def __init__(self, args: argparse.Namespace) -> None:
        self.data = Path(args.data)
        self.values = read_values(self.data)
        self.values.setdefault("ups.test.result", "No test initiated")
        self.commands: list[str] = list(args.command)
        self.log = Path(args.log) if args.log else None
        self.test_seconds = args.test_seconds
        self.test_result = args.test_result
        self.writers: set[asyncio.StreamWriter] = set()
        self.test: asyncio.Task[None] | None = None

    def dump(self) -> list[str]:
        lines = [f"SETINFO {name} {_quoted(value)}" for name, value in self.values.items()]
        for name in self.values:
            if name.startswith("ups.delay."):
                lines += [f"SETFLAGS {name} RW STRING", f"SETAUX {name} 10"]
        lines += [f"ADDCMD {command}" for command in self.commands]
        return [*lines, "DATAOK", "DUMPDONE"]

    def set(self, values: dict[str, str]) -> None:
        self.values.update(values)
        self.send([f"SETINFO {name} {_quoted(value)}" for name, value in values.items()])

    def send(self, lines: list[str]) -> None:
        data = "".join(line + "\n" for line in lines).encode()
        for writer in list(self.writers):
            writer.write(data)

    def record(self, line: str) -> None:
        if self.log is not None:
            with self.log.open("a") as handle:
                handle.write(line + "\n")

    def instcmd(self, name: str) -> None:
        self.record(name)
        if name.startswith("test.battery.start.") and self.test is None:
            self.test = asyncio.ensure_future(self.battery_test(deep=name.endswith("deep")))
        elif name == "test.battery.stop" and self.test is not None:
            self.test.cancel()

    async def battery_test(self, deep: bool) -> None:
        status = "OB DISCHRG CAL" if deep else "OB DISCHRG"
        self.set({"ups.status": status, "ups.test.result": "In progress"})
        result = self.test_result
        try:
            for _ in range(int(self.test_seconds * 10)):
                await asyncio.sleep(0.1)
                if deep:
                    charge = float(self.values.get("battery.charge", "100")) - 0.1
                    runtime = float(self.values.get("battery.runtime", "1800")) - 1
                    self.set(
                        {"battery.charge": f"{charge:.1f}", "battery.runtime": f"{runtime:.0f}"}
                    )
        except asyncio.CancelledError:
            result = "Aborted by user"
        self.set({"ups.status": "OL CHRG", "ups.test.result": result})
        self.test = None

    async def follow_data(self) -> None:
        """The data file replaced: its values are the UPS's from now on."""
        seen = self.data.stat().st_mtime
        while True:
            await asyncio.sleep(0.2)
            with contextlib.suppress(OSError):
                mtime = self.data.stat().st_mtime
                if mtime != seen:
                    seen = mtime
                    self.set(read_values(self.data))

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            while line := (await reader.readline()).decode().strip():
                word, _, rest = line.partition(" ")
                if word == "DUMPALL":
                    self.send(self.dump())
                elif word == "PING":
                    writer.write(b"PONG\n")
                elif word == "INSTCMD":
                    self.instcmd(rest.split(" ")[0])
                elif word == "SET":
                    name, _, value = rest.partition(" ")
                    self.record(f"SET {name} {value}")
                    self.set({name: value.strip('"')})
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
        finally:
            self.writers.discard(writer)


async def main(args: argparse.Namespace) -> None:
    driver = Driver(args)
    Path(args.socket).unlink(missing_ok=True)
    server = await asyncio.start_unix_server(driver.serve, args.socket)
    follow = asyncio.ensure_future(driver.follow_data())
    async with server:
        await server.serve_forever()
    follow.cancel()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="a UPS driver for upsd that plays tests")
    parser.add_argument("--socket", required=True, help="where upsd looks for the driver")
    parser.add_argument("--data", required=True, help="the first values, upsc style")
    parser.add_argument("--command", action="append", default=[], help="an instant command")
    parser.add_argument("--log", help="every command received, one a line")
    parser.add_argument("--test-seconds", type=float, default=2.0)
    parser.add_argument("--test-result", default="Done and passed")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
