"""The pressure scenario's table rows, its targets, and the Markdown tables of docs/RELIABILITY.md.

``python -m benchmarks.pressure_report [JSON]`` prints the Markdown tables of a run's JSON
document (default benchmarks/results/latest.json).
"""

from __future__ import annotations

import json
import math
import sys
from argparse import Namespace
from typing import Any, Optional

from .pressures import CATEGORY
from .report import Report

__all__ = ["record", "summary", "markdown", "overview"]

S = "pressure"


def _num(value: Optional[float]) -> float:
    return float("nan") if value is None else float(value)


def _ratio(value: Optional[float], base: Optional[float]) -> Optional[float]:
    return round(value / base, 2) if value is not None and base else None


def record(report: Report, result: dict, args: Namespace) -> None:
    """A row per phase of one pressure, its outcome, and the targets that apply to it."""
    kind, phases = result["kind"], result["phases"]
    clean = phases["clean"]
    if result["capacity measured"]:
        report.record(S, "capacity (completion, full-speed produce)", round(result["capacity"], 1), "msg/s",
                      f"calls of {args.pressure_batch} from {args.pressure_senders} threads, as the phases send; "
                      f"measured on the {kind} cluster")
        report.record(S, "capacity with calls of 100 from 4 threads", round(result["capacity bulk"], 1), "msg/s",
                      "reference only: cheaper per message than the phases' calls")
    report.record(S, f"{kind}: offered", round(result["offered"], 1), "msg/s",
                  f"+{args.delayed_rate:g}/s delayed; load {result['load']:.1f} -> {result['load end']:.1f}")
    for name, f in phases.items():
        row = {"offered": f["offered"], "stored": f["stored"], "done": f["done"],
               "ratio": _ratio(f["done"], clean["done"]), "claim p50": f["claim p50"], "claim p99": f["claim p99"],
               "answer p50": f.get("answer p50"), "pickup p50": f.get("pickup p50"), "pickup p99": f.get("pickup p99"),
               "depth max": f["depth max"], "history max": f["history max"], "errors": f["produce errors"],
               "late p99": f["late p99"]}
        report.record(S, f"{kind}: {name}", row, "/s, ms")
    outcome = {k: result[k] for k in ("recovery s", "pace s", "drain s", "lost", "dup", "dup same process",
                                      "dup excused", "redelivered",
                                      "unfinished", "never started", "over deadline", "unsent", "stack stop s")}
    outcome["exited"] = len(result["exited"])
    report.record(S, f"{kind}: outcome", outcome, "",
                  f"stress {result['stress s']} s; the fault ended {-result['fault end']} s before it did")
    report.record(S, f"{kind}: stack stop", result["stack stop"], "s", "SIGTERM to every broker and worker at once")
    report.record(S, f"{kind}: pressure did", {**result["pressure"], "log lines stress": result["log lines"]["stress"]},
                  "", f"the benchmark process used {result['bench cpu']} cores")
    if result.get("gc"):
        report.record(S, f"{kind}: cycle collector pauses", result["gc"], "",
                      "collections of 2 ms or more in brokers and workers, clean phase to the end of recovery")
    if result["dup where"]:
        report.record(S, f"{kind}: runs of duplicated ids", result["dup where"], "pid, start")
    report.figures[S].setdefault("results", []).append(result)
    _targets(report, result, args)


def _targets(report: Report, result: dict, args: Namespace) -> None:
    kind, phases, category = result["kind"], result["phases"], CATEGORY[result["kind"]]
    clean, stress = phases["clean"], phases["stress"]
    t = lambda name, value, op, limit: report.target(S, f"{kind} {name}", _num(value), op, limit)  # noqa: E731
    t("lost", result["lost"], "<=", 0)
    t("run twice (not a killed holder's)", result["dup"], "<=", 0)
    t("processes exited", len(result["exited"]), "<=", 0)
    t("clean claim p50 ms", clean["claim p50"], "<=", 5)
    t("clean claim p99 ms", clean["claim p99"], "<=", 25)
    late = result["lateness"]
    t("delayed lateness p99 ms", late["p99"], "<=", 10)
    t("delayed lateness max ms", late["max"], "<=", 50)
    t("delayed early", late["early"], "<=", 0)
    ratio = _ratio(stress["done"], clean["done"])
    if category == "read-view":
        t("completion ratio", ratio, ">=", 0.9)
        limit = 2 * clean["claim p99"] + 20 if clean["claim p99"] is not None else float("nan")
        t("stress claim p99 ms", stress["claim p99"], "<=", round(limit, 1))
    elif category == "worker":
        t("completion ratio", ratio, ">=", 0.9)
        t("stress claim p99 ms", stress["claim p99"], "<=", 2000)
    elif category == "server":
        recovery = result["recovery s"] if result["recovery s"] is not None else result["recovery window"]
        t("recovery s", recovery, "<=", 5)
        t("produce calls over deadline", result["over deadline"], "<=", 0)
    elif category == "overload":
        t("stress completion / capacity", _ratio(stress["done"], result["capacity"]), ">=", 0.9)
        drain = result["drain s"] if result["drain s"] is not None else math.inf
        t("drain s", drain, "<=", result["recovery window"])


def summary(report: Report, results: list[dict]) -> None:
    """The Markdown tables, once every pressure has run (also in the JSON document)."""
    if results:
        report.stream.write("\r\033[K\n" + markdown(results) + "\n")


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}".rstrip("0").rstrip(".")
    return str(value)


def overview(results: list[dict]) -> str:
    """One row per pressure, stress against clean (docs/RELIABILITY.md's table)."""
    lines = ["| pressure | clean done/s | stress ratio | claim p50 / p99 ms, clean | claim p99 ms, stress | "
             "history max, clean → stress | recovery s | lost | run twice (excused) | produce errors |",
             "|" + "---|" * 10]
    for r in results:
        clean, stress = r["phases"]["clean"], r["phases"]["stress"]
        recovery = _cell(r["recovery s"]) if r["recovery s"] is not None else f"> {r['recovery window']}"
        errors = sum(f["produce errors"] for f in r["phases"].values())
        lines.append("| " + " | ".join([
            r["kind"], _cell(clean["done"]), _cell(_ratio(stress["done"], clean["done"])),
            f"{_cell(clean['claim p50'])} / {_cell(clean['claim p99'])}", _cell(stress["claim p99"]),
            f"{_cell(clean['history max'])} → {_cell(stress['history max'])}", recovery, _cell(r["lost"]),
            f"{r['dup']} ({r['dup excused']})", _cell(errors)]) + " |")
    return "\n".join(lines)


def _late(result: dict, key: str) -> str:
    """A time after the fault's end, or "> the recovery window" when it never came."""
    value = result.get(key)
    return _cell(value) if value is not None else f"> {result['recovery window']}"


def markdown(results: list[dict]) -> str:
    """The overview, then a row per pressure and phase, then a row per pressure's outcome."""
    lines = [overview(results), "", "| pressure | phase | offered/s | stored/s | done/s | ratio | claim p50 / p99 ms | "
             "answer p50, pickup p50 / p99 ms | depth max | history max | produce errors | late p99 / max ms |",
             "|" + "---|" * 12]
    for r in results:
        clean = r["phases"]["clean"]
        for name, f in r["phases"].items():
            lines.append("| " + " | ".join([
                r["kind"] if name == "warmup" else "", name, _cell(f["offered"]), _cell(f["stored"]), _cell(f["done"]),
                _cell(_ratio(f["done"], clean["done"])), f"{_cell(f['claim p50'])} / {_cell(f['claim p99'])}",
                f"{_cell(f.get('answer p50'))}, {_cell(f.get('pickup p50'))} / {_cell(f.get('pickup p99'))}",
                _cell(f["depth max"]), _cell(f["history max"]), _cell(f["produce errors"]),
                f"{_cell(f['late p99'])} / {_cell(f['late max'])}"]) + " |")
    lines += ["", "| pressure | what it did | recovery s | pace back s | drain s | lost | run twice (excused) | "
              "over deadline | processes exited | log lines in stress | stack stop s |", "|" + "---|" * 11]
    for r in results:
        did = ", ".join(f"{k} {_cell(v)}" for k, v in r["pressure"].items())
        lines.append("| " + " | ".join([
            r["kind"], did or "–",
            _cell(r["recovery s"]) if r["recovery s"] is not None else f"> {r['recovery window']}",
            _late(r, "pace s"), _late(r, "drain s"), _cell(r["lost"]),
            f"{r['dup']} ({r['dup excused']})", _cell(r["over deadline"]), _cell(len(r["exited"])),
            _cell(r["log lines"]["stress"]), _cell(r.get("stack stop s"))]) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    path = argv[0] if argv else "benchmarks/results/latest.json"
    with open(path) as fh:
        doc = json.load(fh)
    results = doc.get("figures", {}).get(S, {}).get("results")
    if not results:
        print(f"{path} holds no pressure results", file=sys.stderr)
        return 1
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
