#!/usr/bin/env python3
"""Section 14 of docs/benchmarks.md ("Overload, open-loop", issue 39) from the summary lines
bench's `openloop` wrote through ./bench/overload.sh (or ./bench/run.sh comparison 14).

    python3 bench/report_overload.py RESULTS_DIR                      # the section, on stdout
    python3 bench/report_overload.py RESULTS_DIR --splice docs/benchmarks.md
                                      # replace (or add) section 14 of that file in place

bench/report.py imports `section(rows)` for a full run's page. Verdicts are computed from
the issue's targets; a run with none of a target's scenarios shows "–".
"""

import json
import os
import re
import sys

BACKENDS = ["embedded", "rabbitmq_exact", "rabbitmq_management", "fleet3"]
NAMES = {
    "embedded": "embedded (one process)",
    "rabbitmq_exact": "RabbitMQ, exact depth (amqp)",
    "rabbitmq_management": "RabbitMQ, management depth",
    "fleet3": "3 replicas on Redis (exact depth)",
}


def f(v, digits=1, unit=""):
    if v is None:
        return "–"
    return f"{v:,.{digits}f}{unit}"


def verdict(ok):
    return "–" if ok is None else ("**met**" if ok else "**missed**")


def runs(rows, scenario, backend=None, side=None):
    return [
        r
        for r in rows
        if r.get("comparison") == "overload"
        and r.get("scenario") == scenario
        and not r.get("failed")
        and (backend is None or r.get("level") == backend)
        and (side is None or r.get("side") == side)
    ]


def one(rows, scenario, backend, side=None):
    rs = runs(rows, scenario, backend, side)
    return rs[-1] if rs else None


def phase(r, factor, nth=0):
    ps = [p for p in (r or {}).get("phases", []) if abs(p.get("factor", -1) - factor) < 1e-9]
    return ps[nth] if len(ps) > nth else None


def lat(p, which, key):
    return ((p or {}).get(which) or {}).get(key)


def settle_to(r, to):
    for s in (r or {}).get("settle", []):
        if abs(s["to"] - to) < 1e-9:
            return s["settle_s"]
    return None


def stop_of(r):
    st = (r or {}).get("refusals_stop") or []
    return st[-1] if st else None


def short_pct(r):
    return ((r or {}).get("short_polls_while_refusing") or {}).get("short_pct")


def short_pct_by_second(r):
    return (((r or {}).get("short_polls_while_refusing") or {}).get("by_second") or {}).get("short_pct")


def short_text(r):
    """The short polls near a refusal, and (in brackets) by the second."""
    if short_pct(r) is None:
        return "–"
    return f"{f(short_pct(r), 1, ' %')} ({f(short_pct_by_second(r), 1, ' %')})"


def ra_needed(r):
    return (r or {}).get("retry_after_vs_needed") or {}


def backends_in(rows):
    seen = {r.get("level") for r in rows if r.get("comparison") == "overload"}
    return [b for b in BACKENDS if b in seen]


def target_rows(rows):
    out = []
    for b in backends_in(rows):
        fleet = b == "fleet3"
        step = one(rows, "step", b)
        if step:
            s = settle_to(step, 5.0)
            bound = 2 if fleet else 1
            out.append((f"step 0.5× → 5× D: admitted within ±10 % of D for 3 windows within {bound} s", b,
                        "never" if s is None else f"{s} s", verdict(s is not None and s <= bound)))
            exact = b != "rabbitmq_management"
            mine = [x for x in rows if x.get("comparison") == "overload" and x.get("level") == b and not x.get("failed")]
            seen = "; ".join(
                f"{x['scenario']}{'' if x['side'] == 'none' else '/' + x['side']} {x.get('backlog_max')} of {x.get('ceiling')}"
                for x in mine)
            ok = all((x.get("backlog_max") or 0) <= x.get("ceiling", 0) for x in mine)
            out.append(("backlog never above the ceiling (every scenario; the consumer's reads)"
                        + ("" if exact else ": the management source lags, the contract's bound applies"),
                        b, seen, verdict(ok) if exact else "–"))
            sp = short_pct(step)
            out.append((f"work conservation: short polls while refusing ≤ {2 if fleet else 1} % (step)", b,
                        short_text(step), verdict(None if sp is None else sp <= (2 if fleet else 1))))
        sweep = one(rows, "sweep", b)
        if sweep:
            p10, p05, p5 = phase(sweep, 10.0), phase(sweep, 0.5), phase(sweep, 5.0)
            r99 = lat(p10, "refused_latency", "p99_ms")
            out.append(("429 p99 ≤ 1 ms from the intended send time at 10×", b, f(r99, 2, " ms"),
                        verdict(None if r99 is None else r99 <= 1.0)))
            a5, a05 = lat(p5, "admitted_latency", "p99_ms"), lat(p05, "admitted_latency", "p99_ms")
            out.append(("admitted p99 at 5× no worse than at 0.5×", b, f"{f(a5, 2)} vs {f(a05, 2)} ms",
                        verdict(None if a5 is None or a05 is None else a5 <= a05 * 1.1)))
        for policy, bound in (("honour", 1.5), ("client", 1.2), ("naive", None)):
            r = one(rows, "storm", b, policy)
            if not r:
                continue
            apm = r.get("attempts_per_message")
            if bound:
                out.append((f"storm at 5×: attempts per message ≤ {bound} ({policy})", b, f(apm, 2),
                            verdict(apm <= bound)))
            st = stop_of(r)
            if st and policy != "client":  # the client's own refusals are not seen, only its admissions
                end = st["last_refusal_s"]
                out.append((f"storm ({policy}): refusals stop within 5 s of load falling to 0.5×", b,
                            f"{f(end, 1)} s (first attempts {f(st['last_fresh_refusal_s'], 1)} s)",
                            verdict(end <= 5.0)))
        low = one(rows, "low_ceiling", b)
        if low:
            p2 = phase(low, 2.0)
            adm = (p2 or {}).get("admitted_per_s")
            out.append(("ceiling 50 < D × TTL: admitted within ±10 % of D at 2×", b, f(adm, 1, "/s"),
                        verdict(None if adm is None else abs(adm - 100) <= 10)))
            sp = short_pct(low)
            out.append(("ceiling 50 < D × TTL: short polls while refusing ≤ 2 %", b, short_text(low),
                        verdict(None if sp is None else sp <= 2)))
        drop = one(rows, "drop", b, "honour")
        if drop:
            rn = ra_needed(drop)
            ratio = rn.get("ratio_p50")
            needed = rn.get("needed_p50_s")
            nearest = None if needed is None else max(1, round(needed))
            out.append(("capacity drop: Retry-After within ±20 % (p50) of the wait a refused producer needs", b,
                        f"p50 {f(rn.get('advertised_p50_s'), 0, ' s')} told, {f(needed, 2, ' s')} needed"
                        + ("" if nearest is None else f" (the nearest whole second, {nearest} s, is {f(nearest / needed, 2)} of it)")
                        + f"; median of told ÷ needed per refusal {f(ratio, 2)}, {f(rn.get('within_20pct'), 0, ' %')} within ±20 %"
                        + (f", {rn.get('uncovered')} refusals past the run's takes" if rn.get('uncovered') else ""),
                        verdict(None if ratio is None else 0.8 <= ratio <= 1.2)))
        prio = one(rows, "priority", b)
        if prio:
            c = (prio.get("tiers") or {}).get("critical") or {}
            v = c.get("admitted_sends_pct")
            out.append(("priority mix at 5×: critical admitted ≥ 99.4 %", b, f(v, 1, " %"),
                        verdict(None if v is None else v >= 99.4)))
        w = one(rows, "weights", b)
        if w:
            j = ((w.get("tiers") or {}).get("default") or {}).get("jain")
            out.append(("weights 3:1 at ceiling 20, 8/s worker: Jain's index ≥ 0.95", b, f(j, 3),
                        verdict(None if j is None else j >= 0.95)))
    return out


def sweep_table(rows, p):
    p("**Sweep** (refusals dropped; Breakwater's columns; latency from each request's intended send time; "
      "queue length: the depth the consumer read before each take):")
    p("")
    p("| backend | offered | offered/s | goodput/s | admitted p50 / p99 / p99.9 ms | 429 p50 / p99 / p99.9 ms | refused/s | queue length mean / max | Retry-After p50 |")
    p("|---|---|---|---|---|---|---|---|---|")
    for b in backends_in(rows):
        r = one(rows, "sweep", b)
        for ph in (r or {}).get("phases", []):
            p(f"| {b} | {ph['factor']:g}× | {f(ph['offered_per_s'], 0)} | {f(ph['admitted_per_s'], 0)} | "
              f"{f(lat(ph, 'admitted_latency', 'p50_ms'), 2)} / {f(lat(ph, 'admitted_latency', 'p99_ms'), 2)} / "
              f"{f(lat(ph, 'admitted_latency', 'p999_ms'), 2)} | {f(lat(ph, 'refused_latency', 'p50_ms'), 2)} / "
              f"{f(lat(ph, 'refused_latency', 'p99_ms'), 2)} / {f(lat(ph, 'refused_latency', 'p999_ms'), 2)} | "
              f"{f(ph['refused_per_s'], 0)} | {f(ph.get('backlog_mean'), 0)} / {ph.get('backlog_max') if ph.get('backlog_max') is not None else '–'} | "
              f"{f(ph.get('retry_after_p50_s'), 0, ' s')} |")
    p("")


def step_table(rows, p):
    p("**Step** 0.5× → 5× → 10× → 0.5× D (refusals dropped): each phase, the settle time after each step up "
      "(first of 3 consecutive 1 s windows with the admitted rate within ±10 % of D; 0 = the step's own "
      "second) and when the last refusal came after the load fell:")
    p("")
    p("| backend | phase | offered/s | admitted/s | refused/s | admitted p99 ms | 429 p99 ms | backlog mean / max | short polls while refusing | settle | last refusal after the fall |")
    p("|---|---|---|---|---|---|---|---|---|---|---|")
    for b in backends_in(rows):
        r = one(rows, "step", b)
        if not r:
            continue
        st = stop_of(r)
        for i, ph in enumerate(r.get("phases", [])):
            start = sum(x["secs"] for x in r["phases"][:i])
            settle = next((s for s in r.get("settle", []) if abs(s["at_s"] - start) < 1e-6), None)
            settle_text = "" if settle is None else ("never" if settle["settle_s"] is None else f"{settle['settle_s']} s")
            last = f"{f(st['last_refusal_s'], 1)} s" if st and i == len(r["phases"]) - 1 else ""
            p(f"| {b} | {ph['factor']:g}× | {f(ph['offered_per_s'], 0)} | {f(ph['admitted_per_s'], 0)} | "
              f"{f(ph['refused_per_s'], 0)} | {f(lat(ph, 'admitted_latency', 'p99_ms'), 2)} | "
              f"{f(lat(ph, 'refused_latency', 'p99_ms'), 2)} | {f(ph.get('backlog_mean'), 0)} / {ph.get('backlog_max')} | "
              f"{'' if i else short_text(r)} | {settle_text} | {last} |")
    p("")


def storm_table(rows, p):
    p("**Retry storm** 0.5× → 5× → 0.5× by producer policy (give-up 120 s from the first intended send; "
      "the project's client: one `sendgate_client::Client` per tenant and level, its deadline 120 s, its "
      "attempts its own count, its refusals not seen by the bench: –). Messages still waiting out a `Retry-After` when the window closed are "
      "counted with the attempts they made:")
    p("")
    p("| backend | policy | attempts / message | goodput/s | admitted | gave up | waiting at the end | Retry-After p50 / p99 | last refusal after the fall (all / first attempts) |")
    p("|---|---|---|---|---|---|---|---|---|")
    for b in backends_in(rows):
        for policy in ("naive", "honour", "client"):
            r = one(rows, "storm", b, policy)
            if not r:
                continue
            st = (stop_of(r) if policy != "client" else None) or {}
            p(f"| {b} | {policy} | {f(r.get('attempts_per_message'), 2)} | {f(r.get('goodput_per_s'), 0)} | "
              f"{r.get('admitted_messages')} of {r.get('messages')} | {r.get('gave_up')} | {r.get('messages_in_flight_at_end')} | "
              f"{f(r.get('retry_after_p50_s'), 0, ' s')} / {f(r.get('retry_after_p99_s'), 0, ' s')} | "
              f"{f(st.get('last_refusal_s'), 1, ' s')} / {f(st.get('last_fresh_refusal_s'), 1, ' s')} |")
    p("")


def tiers_table(rows, p):
    p("**Priority mix** at 5× D (60 % sheddable / 30 % default / 10 % critical, one tenant, the key "
      "`critical`, each send lowering itself with `Sendgate-Criticality`; refusals dropped) and "
      "**weights 3:1** (two tenants each offering 2.5× a worker of 8/s, ceiling 20), over the "
      "overload phase:")
    p("")
    p("| backend | scenario | tier | sends | admitted (% of sends) | admitted per unit of weight, by tenant | Jain's index |")
    p("|---|---|---|---|---|---|---|")
    for b in backends_in(rows):
        for scen in ("priority", "weights"):
            r = one(rows, scen, b)
            for tier, t in ((r or {}).get("tiers") or {}).items():
                p(f"| {b} | {scen} | {tier} | {t.get('sends')} | {t.get('admitted_sends')} ({f(t.get('admitted_sends_pct'), 1, ' %')}) | "
                  f"{', '.join(f(x, 0) for x in t.get('admitted_per_weight_by_tenant', []))} | {f(t.get('jain'), 3)} |")
            if r and scen == "weights":
                reasons = (phase(r, 5.0) or {}).get("by_reason") or {}
                p(f"| {b} | weights | refusals | {', '.join(f'{k} {v}' for k, v in sorted(reasons.items()))} | | | |")
    p("")


def drop_low_table(rows, p):
    p("**Capacity drop** (0.8× D offered; D halves for a while, producers honour `Retry-After`) and a "
      "**ceiling below D × TTL** (ceiling 50, D 100/s, 0.5× → 2× → 0.5×, refusals dropped):")
    p("")
    p("| backend | scenario | admitted/s (overload phase) | refused | Retry-After p50 / p99 | short polls while refusing | backlog max | last refusal after the fall |")
    p("|---|---|---|---|---|---|---|---|")
    for b in backends_in(rows):
        for scen in ("drop", "low_ceiling"):
            r = one(rows, scen, b)
            if not r:
                continue
            ph = phase(r, 2.0) if scen == "low_ceiling" else phase(r, 0.8)
            st = stop_of(r) or {}
            p(f"| {b} | {scen} | {f((ph or {}).get('admitted_per_s'), 1)} | {(ph or {}).get('refused')} | "
              f"{f(r.get('retry_after_p50_s'), 0, ' s')} / {f(r.get('retry_after_p99_s'), 0, ' s')} | "
              f"{short_text(r)} | {r.get('backlog_max')} of {r.get('ceiling')} | "
              f"{f(st.get('last_refusal_s'), 1, ' s') if st else '–'} |")
    p("")


def section(rows, image_dir="benchmarks"):
    ov = [r for r in rows if r.get("comparison") == "overload"]
    if not ov:
        return []
    out = []
    p = out.append
    commits = sorted({r.get("commit", "?") for r in ov})
    labels = sorted({r.get("label") for r in ov if r.get("label")})
    quick = any(r.get("quick") for r in ov)
    p("## 14. Overload, open-loop")
    p("")
    p(
        f"`./bench/overload.sh{' --quick' if quick else ''}` (issue 39), sendgate commit {', '.join(f'`{c}`' for c in commits)}"
        + (f", **{'; '.join(labels)}**" if labels else "")
        + (", quick windows" if quick else ", full windows")
        + ". bench's `openloop`: arrivals on a seeded Poisson schedule sent when due whatever came "
        "back before (open loop), every latency from the attempt's *intended* send time (no "
        "coordinated omission), a consumer taking D messages a second with no credit for a poll "
        "that found too few (embedded: `sendgate queue receive` every 100 ms; RabbitMQ: "
        "`basic.get`). D = 100/s and a ceiling of 200 unless said. A *short poll* found fewer "
        "messages than it asked for; *while refusing*: within 0.1 s of a send refused "
        "`queue_full` (in brackets: any poll in a second in which some send was refused, which also "
        "counts a second's polls from before its first refusal, such as a fleet's start-up grace)."
    )
    p("")
    p("| target (issue 39) | backend | measured | verdict |")
    p("|---|---|---|---|")
    for t, b, m, v in target_rows(rows):
        p(f"| {t} | {b} | {m} | {v} |")
    p("")
    sweep_table(rows, p)
    step_table(rows, p)
    storm_table(rows, p)
    tiers_table(rows, p)
    drop_low_table(rows, p)
    for name, what in (("step", "Step response"), ("storm", "Attempts per message by policy"),
                       ("priority", "Admissions per tier")):
        p(f"![{what}]({image_dir}/overload-{name}.png)")
        p("")
    skipped = sorted({r.get("level") for r in rows if r.get("comparison") == "overload" and r.get("failed")})
    if skipped:
        p(f"Failed runs (no numbers): {', '.join(skipped)}.")
        p("")
    return out


def splice(path, lines):
    text = open(path).read().split("\n")
    start = next((i for i, l in enumerate(text) if l.startswith("## 14. ")), None)
    if start is None:
        at = next((i for i, l in enumerate(text) if l.startswith("## Dependency diet")), len(text))
        new = text[:at] + lines + text[at:]
    else:
        end = next((i for i in range(start + 1, len(text)) if text[i].startswith("## ")), len(text))
        new = text[:start] + lines + text[end:]
    open(path, "w").write("\n".join(new))


if __name__ == "__main__":
    if len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and sys.argv[2] != "--splice"):
        sys.exit("usage: report_overload.py RESULTS_DIR [--splice docs/benchmarks.md]")
    rows = [json.loads(l) for l in open(os.path.join(sys.argv[1], "results.jsonl")) if l.strip()]
    lines = section(rows)
    if len(sys.argv) == 4:
        splice(sys.argv[3], lines)
    else:
        print("\n".join(lines))
