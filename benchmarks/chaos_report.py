"""The chaos benchmark's report: the streams' endings, the kills, the greedy check, and every
replica seen at the start or the end with its KV blocks free at the end and its resident memory
then and now; and what makes the run fail (an accepted stream that failed, more streams cut than
the killed router replicas carried, a completed stream that differs from the offline engine, a
replica whose blocks are not all free).
"""

from collections import Counter
from typing import Any

from pdserve.benchmarks.chaos_kills import Kill
from pdserve.benchmarks.chaos_load import ENDINGS, Outcome
from pdserve.serving.config import ROUTER_DEPLOYMENT

MIB = 2**20
# deployment -> replica id -> its stats (None: it did not answer)
PoolStats = dict[str, dict[str, dict | None]]


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
    """Streams started and how they ended; errors by message (failed, cut and refused apart)."""
    counts = Counter(outcome.ending for outcome in outcomes)
    return {
        "started": len(outcomes),
        **{ending: counts[ending] for ending in ENDINGS},
        "errors": dict(Counter(o.error for o in outcomes if o.ending == "failed")),
        "cuts": dict(Counter(o.error for o in outcomes if o.ending == "cut")),
        "refusals": dict(Counter(o.error for o in outcomes if o.ending == "refused")),
    }


def _field(stats: dict | None, key: str) -> Any:
    return None if stats is None else stats.get(key)


def replica_rows(start: PoolStats, end: PoolStats, kills: list[Kill]) -> list[dict[str, Any]]:
    """One row per replica live at the start or the end: a killed one's successor is a new row."""
    killed = {kill.replica for kill in kills}
    rows = []
    for deployment in dict.fromkeys([*start, *end]):  # in order, once each
        before, after = start.get(deployment, {}), end.get(deployment, {})
        for replica in dict.fromkeys([*before, *after]):
            first, last = before.get(replica), after.get(replica)
            rows.append(
                {
                    "deployment": deployment,
                    "replica": replica,
                    "killed": replica in killed,
                    "live_at_end": replica in after,
                    "free_blocks": _field(last, "num_free_blocks"),
                    "num_blocks": _field(last, "num_blocks"),
                    "rss_start_bytes": _field(first, "rss_bytes"),
                    "rss_end_bytes": _field(last, "rss_bytes"),
                    # Its KV transfers that failed, by reason: each one recomputed.
                    "transfer_failures": _field(last, "kv_failures"),
                }
            )
    return rows


def problems(
    summary: dict[str, Any],
    rows: list[dict[str, Any]],
    kills: list[Kill],
    greedy: dict[str, int] | None,
) -> list[str]:
    """Why the run fails; none: it passed."""
    found = []
    if summary["failed"]:
        found.append(f"{summary['failed']} accepted streams failed")
    # A stream sent while a router replica's requests were counted may be missing from the count.
    carried = sum(k.carried for k in kills if k.deployment == ROUTER_DEPLOYMENT)
    carried += summary.get("cut_sent_during_a_kill", 0)
    if summary["cut"] > carried:
        found.append(
            f"{summary['cut']} streams cut by router kills, more than the killed router "
            f"replicas carried ({carried})"
        )
    if greedy is not None and greedy["differ"]:
        found.append(f"{greedy['differ']} of {greedy['checked']} completed streams differ offline")
    for row in (r for r in rows if r["live_at_end"]):
        where = f"{row['deployment']} replica {row['replica']}"
        if row["free_blocks"] is None:
            found.append(f"{where} did not answer at the end")
        elif row["free_blocks"] != row["num_blocks"]:
            found.append(f"{where}: {row['free_blocks']} of {row['num_blocks']} KV blocks free")
    return found


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:.0f}"


def _end_cells(row: dict[str, Any]) -> tuple[str, str]:
    """The KV and RSS cells at the end."""
    if not row["live_at_end"]:
        gone = "killed" if row["killed"] else "gone"
        return gone, gone
    if row["free_blocks"] is None:
        return "no answer", "-"
    return f"{row['free_blocks']} / {row['num_blocks']}", _mib(row["rss_end_bytes"])


def print_report(result: dict[str, Any]) -> None:
    summary, config = result["summary"], result["config"]
    print(
        f"{result['model']}: {config['streams']} streams for {result['seconds']:.0f} s, a kill "
        f"every {config['kill_every']:g} s ({config['kill'] or 'none'}), disconnect fraction "
        f"{config['disconnect_fraction']:g}"
    )
    counts = ["started", *ENDINGS]
    print("| " + " | ".join([*counts, "migrated", "kills"]) + " |")
    print("|---" * (len(counts) + 2) + "|")
    figures = [*(summary[name] for name in counts), result["migrated"], len(result["kills"])]
    print("| " + " | ".join(map(str, figures)) + " |")
    for kill in result["kills"]:
        victim = kill["replica"] or "none live"
        print(
            f"kill at {kill['at_s']:.1f} s: {kill['deployment']} replica {victim}, "
            f"carrying {kill['carried']} requests"
        )
    failures = Counter()
    for row in result["replicas"]:
        failures.update(row["transfer_failures"] or {})
    if failures:
        by_reason = ", ".join(f"{reason} {n}" for reason, n in sorted(failures.items()))
        print(f"KV transfers failed and recomputed (replicas live at the end): {by_reason}")
    if result["greedy"] is not None:
        greedy = result["greedy"]
        print(f"greedy check: {greedy['differ']} of {greedy['checked']} completed streams differ")
    endings = ("failed", "errors"), ("cut", "cuts"), ("refused", "refusals")
    for title, errors in ((title, summary[key]) for title, key in endings):
        for error, count in errors.items():
            print(f"{title} ({count}): {error}")
    print("| deployment | replica | KV blocks free / total | RSS start MiB | RSS end MiB |")
    print("|---|---|---|---|---|")
    for row in result["replicas"]:
        blocks, rss_end = _end_cells(row)
        print(
            f"| {row['deployment']} | {row['replica']} | {blocks} "
            f"| {_mib(row['rss_start_bytes'])} | {rss_end} |"
        )
    for problem in result["problems"]:
        print(f"FAILED: {problem}")
