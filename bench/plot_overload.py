#!/usr/bin/env python3
"""The plots of section 14 (issue 39) from ./bench/overload.sh's results.jsonl:

    python bench/plot_overload.py RESULTS_DIR OUT_DIR

writes OUT_DIR/overload-step.png (offered, admitted and refused per second, and the backlog
against the ceiling, one column per backend), overload-storm.png (attempts per message by
producer policy) and overload-priority.png (each criticality's admitted share of its sends).
Run with matplotlib from the project's venv (./bench/overload.sh installs it there).
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from report_overload import BACKENDS, backends_in, one  # noqa: E402

rows = [json.loads(l) for l in open(os.path.join(sys.argv[1], "results.jsonl")) if l.strip()]
out_dir = sys.argv[2]
backends = backends_in(rows)


def step_plot():
    have = [b for b in backends if one(rows, "step", b)]
    if not have:
        return
    fig, axes = plt.subplots(2, len(have), figsize=(6 * len(have), 6), squeeze=False, sharex="col")
    for col, b in enumerate(have):
        r = one(rows, "step", b)
        s = r["series"]
        t = [x["t"] for x in s]
        top, bottom = axes[0][col], axes[1][col]
        top.plot(t, [x["offered"] for x in s], label="offered", color="tab:gray")
        top.plot(t, [x["admitted"] for x in s], label="admitted", color="tab:green")
        top.plot(t, [x["refused"] for x in s], label="refused (429)", color="tab:red")
        top.plot(t, [x["drain_rate"] for x in s], label="drain rate D", color="black", linestyle="--")
        top.set_title(f"step 0.5× → 5× → 10× → 0.5× D: {b}")
        top.set_ylabel("per second")
        top.legend(fontsize="small")
        bottom.plot(t, [x.get("backlog_max") for x in s], label="backlog (max read)", color="tab:blue")
        bottom.axhline(r.get("ceiling", 0), color="tab:red", linestyle="--", label="ceiling")
        bottom.set_ylabel("messages")
        bottom.set_xlabel("seconds")
        bottom.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "overload-step.png"), dpi=90)


def storm_plot():
    have = [b for b in backends if any(one(rows, "storm", b, p) for p in ("naive", "honour", "client"))]
    if not have:
        return
    policies = ["naive", "honour", "client"]
    fig, ax = plt.subplots(figsize=(2.5 + 2.5 * len(have), 4))
    width = 0.8 / len(policies)
    for i, policy in enumerate(policies):
        vals = [(one(rows, "storm", b, policy) or {}).get("attempts_per_message") or 0 for b in have]
        xs = [k + i * width for k in range(len(have))]
        ax.bar(xs, vals, width, label=policy)
        for x, v in zip(xs, vals):
            ax.text(x, v, f"{v:.2f}", ha="center", va="bottom", fontsize="small")
    ax.axhline(1.5, color="tab:red", linestyle="--", linewidth=1, label="target (honour) 1.5")
    ax.axhline(1.2, color="tab:purple", linestyle=":", linewidth=1, label="target (client) 1.2")
    ax.set_xticks([k + width for k in range(len(have))], have)
    ax.set_ylabel("attempts per message")
    ax.set_title("retry storm at 5× D by producer policy")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "overload-storm.png"), dpi=90)


def priority_plot():
    have = [b for b in backends if one(rows, "priority", b)]
    if not have:
        return
    tiers = ["sheddable", "default", "critical"]
    fig, ax = plt.subplots(figsize=(2.5 + 2.5 * len(have), 4))
    width = 0.8 / len(tiers)
    colors = {"sheddable": "tab:gray", "default": "tab:blue", "critical": "tab:red"}
    for i, tier in enumerate(tiers):
        vals = [((one(rows, "priority", b).get("tiers") or {}).get(tier) or {}).get("admitted_sends_pct") or 0
                for b in have]
        xs = [k + i * width for k in range(len(have))]
        ax.bar(xs, vals, width, label=tier, color=colors[tier])
        for x, v in zip(xs, vals):
            ax.text(x, v, f"{v:.0f} %", ha="center", va="bottom", fontsize="small")
    ax.axhline(99.4, color="tab:red", linestyle="--", linewidth=1, label="target (critical) 99.4 %")
    ax.set_xticks([k + width for k in range(len(have))], have)
    ax.set_ylabel("sends admitted (%)")
    ax.set_ylim(0, 110)
    ax.set_title("priority mix 60/30/10 at 5× D")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "overload-priority.png"), dpi=90)


assert BACKENDS
step_plot()
storm_plot()
priority_plot()
