"""``mwp db upgrade`` before a release starts (docs/upgrades.md): one CronJob, a template that never
runs by itself."""

from __future__ import annotations

from .contract import Contract
from .objects import env_of, pod_of


def check_db_upgrade(c: Contract) -> None:
    upgrades = [
        cron
        for cron in c.of_kind("CronJob")
        if pod_of(cron)["containers"][0].get("args", [])[:2] == ["db", "upgrade"]
    ]
    c.check(len(upgrades) == 1, f"expected one CronJob running `mwp db upgrade`, found {len(upgrades)}")
    for cron in upgrades:
        c.check(
            cron["spec"].get("suspend") is True,
            f"CronJob {cron['metadata']['name']}: must be suspended (a template for jobs)",
        )
        c.check(
            "MWP_DATABASE_URL" in env_of(pod_of(cron)["containers"][0]),
            f"CronJob {cron['metadata']['name']}: needs MWP_DATABASE_URL",
        )
