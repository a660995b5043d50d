"""The race the start-up's port checks leave open, made certain: each address is seen free at its
first check whoever listens there, as if it were taken just after. Run as `python -m tests.port_race
serve ...` for `mwp serve` with it; ``first_check_passes`` for a test in this process."""

from __future__ import annotations

import sys
from collections.abc import Callable

from missionweave_server.edge.channels import check_port_free


def first_check_passes(check: Callable[[str, str], None] = check_port_free) -> Callable[[str, str], None]:
    """``check`` but for each address's first call, which passes."""
    seen: set[str] = set()

    def racing(address: str, role: str) -> None:
        if address in seen:
            check(address, role)
        seen.add(address)

    return racing


if __name__ == "__main__":
    from missionweave.cli.app import main
    from missionweave_server.mesh import ports

    ports.check_port_free = first_check_passes()
    sys.exit(main())
