#include "opfuse/report_html.h"

#include <string_view>

namespace opfuse::report {
namespace {

// The page draws itself from the JSON in #analysis, so the C++ side only embeds data; every
// name reaches the DOM through textContent or setAttribute, never through innerHTML.
constexpr std::string_view kPage = R"page(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>opfuse analysis</title>
<style>
  :root {
    --fg: #1f2328; --muted: #656d76; --line: #d8dee4; --head: #f6f8fa;
    --bar: #4c78a8; --other: #b8c2cc; --save: #59a14f; --before: #a9b4bf; --after: #4c78a8;
    --better: #2f7d32; --worse: #c62828;
  }
  body {
    font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
    color: var(--fg); background: #fff; max-width: 1180px; margin: 24px auto; padding: 0 20px;
  }
  h1 { font-size: 20px; margin: 0 0 2px; }
  h2 { font-size: 16px; margin: 32px 0 10px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
  h3 { font-size: 14px; margin: 16px 0 6px; }
  p.note, .muted { color: var(--muted); }
  p.note { margin: 0 0 8px; }
  p.warning { margin: 0 0 8px; color: var(--worse); font-weight: 600; }
  code, .path { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; }
  .meta { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: 10px 18px; margin-top: 14px; }
  .meta div { border-left: 3px solid var(--line); padding-left: 8px; }
  .meta .label { display: block; color: var(--muted); font-size: 12px; }
  .meta .value { font-size: 16px; font-variant-numeric: tabular-nums; }
  .meta .warn { border-left-color: var(--worse); }
  table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
  th, td { padding: 4px 8px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
  th { background: var(--head); font-weight: 600; white-space: nowrap; }
  td.num, th.num { text-align: right; white-space: nowrap; }
  td.name { word-break: break-all; }
  ul.locs { margin: 0; padding: 0; list-style: none; font-size: 12.5px; }
  svg.chart { width: 100%; height: auto; display: block; }
  svg.chart text { font-size: 12px; fill: var(--fg); }
  svg.chart text.value { fill: var(--muted); }
  .step { font-size: 18px; font-variant-numeric: tabular-nums; }
  .better { color: var(--better); } .worse { color: var(--worse); }
  .legend { font-size: 12px; color: var(--muted); }
  .legend span { display: inline-block; width: 10px; height: 10px; margin: 0 4px 0 12px; vertical-align: -1px; }
  ul.changes li { margin: 2px 0; }
  .timeline-tools { display: flex; gap: 6px; align-items: center; margin: 4px 0 6px; font-size: 12px; color: var(--muted); }
  .timeline-tools button { font: inherit; padding: 1px 8px; border: 1px solid var(--line); background: var(--head); border-radius: 4px; cursor: pointer; }
  figure.timeline { margin: 0 0 12px; position: relative; }
  figure.timeline figcaption { font-size: 12.5px; margin: 0 0 2px; }
  figure.timeline canvas { display: block; width: 100%; border: 1px solid var(--line); cursor: grab; touch-action: none; }
  .timeline-tip { position: absolute; pointer-events: none; background: #fff; border: 1px solid var(--line); border-radius: 4px;
    padding: 4px 6px; font-size: 12px; box-shadow: 0 1px 4px rgba(0,0,0,.15); max-width: 520px; word-break: break-all; display: none; z-index: 2; }
  .timeline-detail { font-size: 12.5px; min-height: 1.45em; }
  .timeline-legend span.swatch { display: inline-block; width: 10px; height: 10px; margin: 0 4px 0 12px; vertical-align: -1px; }
</style>
</head>
<body>
<noscript><p>This page draws the analysis with JavaScript, which is turned off. The data is in the
<code>&lt;script id="analysis"&gt;</code> element of this file, as JSON.</p></noscript>
<header id="header"></header>
<main id="report"></main>
<script type="application/json" id="analysis">@ANALYSIS@</script>
<script>
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("analysis").textContent);
  const SVG = "http://www.w3.org/2000/svg";

  // Any key may be missing or null (older JSON, no device track); show a dash, never NaN.
  const isNum = (v) => typeof v === "number" && isFinite(v);
  const list = (v) => (Array.isArray(v) ? v : []);
  const str = (v) => (v === null || v === undefined ? "" : String(v));
  // Two decimals everywhere so a column of ms lines up; under 5 us would round to a bare 0.00.
  const ms = (us) => (!isNum(us) ? "–" : us > 0 && us < 5 ? "<0.01" : (us / 1000).toFixed(2));
  const fixed = (v, digits) => (isNum(v) ? v.toFixed(digits) : "–");
  const range = (ci, digits = 2) => `[${list(ci).map((x) => fixed(x, digits)).join(", ")}]`;
  const count = (v) => (isNum(v) ? Math.round(v).toLocaleString("en-US") : "–");
  const clip = (s, n) => (s.length > n ? s.slice(0, n - 1) + "…" : s);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    for (const c of children) node.append(c instanceof Node ? c : str(c));
    return node;
  }

  function svgEl(tag, attrs, content) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (content !== undefined) node.textContent = content;
    return node;
  }

  function section(title, note) {
    const s = el("section", {}, el("h2", {}, title));
    if (note) s.append(el("p", { class: "note" }, note));
    document.getElementById("report").append(s);
    return s;
  }

  // columns: [{title, num}]; rows: [{cells, attrs}]
  function table(columns, rows) {
    const head = el("tr", {}, ...columns.map((c) => el("th", c.num ? { class: "num" } : {}, c.title)));
    const body = rows.map((r) =>
      el("tr", r.attrs || {}, ...r.cells.map((cell, i) => el("td", { class: columns[i].num ? "num" : "name" }, cell))));
    return el("table", {}, el("thead", {}, head), el("tbody", {}, ...body));
  }

  const W = 1100, LABEL = 340, VALUE = 90, ROW = 22, BAR = 14;
  const mb = (bytes) => (isNum(bytes) ? `${(bytes / 1e6).toFixed(1)} MB` : "?");

  // Horizontal bars: rows [{label, value (us), colour}], the label column clipped, full name in <title>.
  function barChart(rows, label = (v) => `${ms(v)} ms`) {
    const max = Math.max(1e-9, ...rows.map((r) => (isNum(r.value) ? r.value : 0)));
    const span = W - LABEL - VALUE;
    const chart = svgEl("svg", { class: "chart", viewBox: `0 0 ${W} ${rows.length * ROW + 4}`, role: "img" });
    rows.forEach((r, i) => {
      const y = i * ROW + 2, v = isNum(r.value) ? r.value : 0, w = v > 0 ? Math.max(1, (v / max) * span) : 0;
      const g = svgEl("g", {});
      g.append(svgEl("title", {}, `${r.label}: ${label(r.value)}`));
      g.append(svgEl("text", { x: LABEL - 8, y: y + BAR - 2, "text-anchor": "end" }, clip(r.label, 48)));
      g.append(svgEl("rect", { x: LABEL, y, width: w.toFixed(1), height: BAR, rx: 2, fill: r.colour || "var(--bar)" }));
      g.append(svgEl("text", { class: "value", x: LABEL + w + 6, y: y + BAR - 2 }, label(r.value)));
      chart.append(g);
    });
    return chart;
  }

  // Two bars per op, before above after, on one scale so the eye compares lengths directly.
  function groupedChart(rows, label = (v) => `${ms(v)} ms`) {
    const GROUP = 2 * BAR + 12;
    const max = Math.max(1e-9, ...rows.flatMap((r) => [r.before, r.after].map((v) => (isNum(v) ? v : 0))));
    const span = W - LABEL - VALUE;
    const chart = svgEl("svg", { class: "chart", viewBox: `0 0 ${W} ${rows.length * GROUP + 4}`, role: "img" });
    rows.forEach((r, i) => {
      const y0 = i * GROUP + 2;
      const g = svgEl("g", {});
      g.append(svgEl("title", {}, `${r.label}: ${label(r.before)} → ${label(r.after)}, ${r.calls}`));
      g.append(svgEl("text", { x: LABEL - 8, y: y0 + BAR + 4, "text-anchor": "end" }, clip(r.label, 48)));
      [[r.before, "var(--before)"], [r.after, "var(--after)"]].forEach(([value, fill], k) => {
        const v = isNum(value) ? value : 0, w = v > 0 ? Math.max(1, (v / max) * span) : 0, y = y0 + k * BAR;
        g.append(svgEl("rect", { x: LABEL, y, width: w.toFixed(1), height: BAR - 1, fill }));
        g.append(svgEl("text", { class: "value", x: LABEL + w + 6, y: y + BAR - 3 }, label(value)));
      });
      chart.append(g);
    });
    return chart;
  }

  function findingLabel(f) {
    const rule = str(f.rule) || str(f.pattern) || "mined";
    return f.replacement ? `${rule} → ${f.replacement}` : rule;
  }

  function locations(f) {
    const top = list(f.locations).slice(0, 5);
    if (!top.length) return "";
    return el("ul", { class: "locs" }, ...top.map((l) => el("li", {}, `${str(l.location) || "?"} ×${count(l.count)}`)));
  }

  function meta(label, value, warn) {
    return el("div", warn ? { class: "warn" } : {}, el("span", { class: "label" }, label), el("span", { class: "value" }, value));
  }

  function renderHeader(trace, device) {
    const h = document.getElementById("header");
    h.append(el("h1", {}, "opfuse analysis"), el("div", { class: "path" }, str(trace.path) || "(unnamed trace)"));
    const grid = el("div", { class: "meta" },
      meta("dialect", str(trace.dialect) || "–"), meta("backend", str(trace.backend) || "–"),
      meta("events", count(trace.events)), meta("duration", `${ms(trace.duration_us)} ms`),
      meta("steps", trace.steps > 0 ? `${count(trace.steps)}${trace.steps_from === "given" ? " (given)" :
        trace.steps_from === "repeated pattern" ? " (the top-level ops repeat)" : ""}` :
        "none marked: times are totals"),
      meta("step time (traced)", trace.steps > 0 ? `${ms(trace.step_us)} ms` : "–"),
      meta("skipped events", count(trace.skipped_events), trace.skipped_events > 0));
    if (device) {
      const per = device.per === "step" ? " per step" : "";
      const busy = isNum(device.busy_us) ? device.busy_us : device.kernel_us;
      grid.append(meta("device busy", `${ms(busy)} ms${per}`), meta("device idle", `${ms(device.idle_us)} ms${per}`));
    }
    h.append(grid);
  }

  // On device traces the step is the kernels' time, so ops are ranked by what they launched.
  function renderOpChart(ops, backend) {
    const onDevice = backend !== "cpu" && ops.some((o) => isNum(o.device_us) && o.device_us > 0);
    const key = onDevice ? "device_us" : "self_us";
    const bySelf = [...ops].sort((a, b) => (b[key] || 0) - (a[key] || 0));
    const rows = bySelf.slice(0, 15).map((o) => ({ label: str(o.name), value: perStep(o[key]) }));
    const rest = bySelf.slice(15).reduce((sum, o) => sum + (isNum(o[key]) ? o[key] : 0), 0);
    if (rest > 0) rows.push({ label: `other (${bySelf.length - 15} ops)`, value: perStep(rest), colour: "var(--other)" });
    const s = section("Where the time goes", onDevice ? `Device time per op (the kernels each op launched, ${UNIT}), top 15.` :
      `Self time per op (time not spent in child ops, ${UNIT}), top 15.`);
    s.append(rows.length ? barChart(rows) : el("p", { class: "muted" }, "No ops in this trace."));
  }

  function renderFindings(findings) {
    const s = section("Findings", `Estimated saving if each pattern were replaced by its fused op (${UNIT}).`);
    if (!findings.length) {
      s.append(el("p", { class: "muted" }, "No fusable patterns found."));
      return;
    }
    const bySaving = [...findings].sort((a, b) => (b.est_saving_us || 0) - (a.est_saving_us || 0));
    s.append(barChart(bySaving.map((f) => ({ label: findingLabel(f), value: perStep(f.est_saving_us), colour: "var(--save)" }))));
    const columns = [{ title: "rule" }, { title: "pattern" }, { title: "replacement" }, { title: "backend" },
      { title: "occurrences", num: true }, { title: `time (${UNIT})`, num: true },
      { title: `est. saving (${UNIT})`, num: true }, { title: "on the critical path", num: true }, { title: "locations" }];
    const rows = findings.map((f) => ({
      attrs: { class: "finding", "data-rule": str(f.rule) },
      cells: [str(f.rule) || str(f.kind), str(f.pattern), str(f.replacement) || "–", str(f.backend),
        count(f.occurrences), ms(perStep(f.time_us)), f.estimated === false ? "not estimated" : ms(perStep(f.est_saving_us)),
        isNum(f.critical_share) ? `${(f.critical_share * 100).toFixed(0)}%` : "–", locations(f)],
    }));
    s.append(el("h3", {}, "All findings"), table(columns, rows));
    const path = data.critical_path;
    if (path && isNum(path.length_us) && path.length_us > 0) {
      const pct = (us) => `${((100 * us) / path.length_us).toFixed(0)}%`;
      s.append(el("p", { class: "note", id: "critical-path" }, `Critical path: ${ms(perStep(path.length_us))} ms ` +
        `(${STEPS ? "per step" : "whole trace"}; host ops ${pct(path.host_us)}, ` +
        `device ${pct(path.device_us)}, gaps ${pct(path.idle_us)}); with every finding's chains fused, by the estimates, ` +
        `${ms(perStep(path.predicted_us))} ms.`));
    }
  }

  function renderOps(ops) {
    const TOP = 30;
    const bySelf = [...ops].sort((a, b) => (b.self_us || 0) - (a.self_us || 0)).slice(0, TOP);
    const s = section("Top ops", `By self time; ${Math.min(TOP, ops.length)} of ${ops.length} ops.`);
    if (!bySelf.length) return;
    const hasDevice = ops.some((o) => isNum(o.device_us));
    const columns = [{ title: "name" }, { title: "calls (trace)", num: true }, { title: `total (${UNIT})`, num: true },
      { title: `self (${UNIT})`, num: true }, { title: "mean us", num: true }];
    if (hasDevice) columns.push({ title: `device (${UNIT})`, num: true });
    s.append(table(columns, bySelf.map((o) => {
      const cells = [str(o.name), count(o.count), ms(perStep(o.total_us)), ms(perStep(o.self_us)), fixed(o.mean_us, 2)];
      if (hasDevice) cells.push(ms(perStep(o.device_us)));
      return { cells };
    })));
  }

  function stepChange(before, after) {
    const line = el("p", { class: "step" }, `traced step time ${ms(before)} ms → ${ms(after)} ms`);
    if (isNum(before) && isNum(after) && before > 0) {
      const pct = ((after - before) / before) * 100;
      const sign = pct > 0 ? "+" : pct < 0 ? "−" : "±";
      line.append(" ", el("span", { class: pct < 0 ? "better" : pct > 0 ? "worse" : "" }, `(${sign}${Math.abs(pct).toFixed(1)}%)`));
    }
    return line;
  }

  function changeList(title, findings) {
    const items = findings.map((f) =>
      el("li", { class: "finding-change", "data-rule": str(f.rule) },
        el("strong", {}, findingLabel(f)),
        ` — ${str(f.pattern)}, ${count(f.occurrences)} occurrences, est. saving ${ms(f.est_saving_us)} ms`));
    return [el("h3", {}, title), items.length ? el("ul", { class: "changes" }, ...items) : el("p", { class: "muted" }, "none")];
  }

  function renderDiff(diff) {
    const s = section("Before → after");
    s.id = "diff";
    const after = (diff.after && diff.after.trace) || {};
    s.append(el("p", { class: "note" }, "after: ", el("span", { class: "path" }, str(after.path) || "(unnamed trace)")));
    s.append(stepChange(diff.step_us_before, diff.step_us_after));
    const peak = (o) => Math.max(isNum(o.total_us_before) ? o.total_us_before : 0, isNum(o.total_us_after) ? o.total_us_after : 0);
    const ops = list(diff.ops).slice().sort((a, b) => peak(b) - peak(a)).slice(0, 12);
    if (ops.length) {
      s.append(el("h3", {}, "Total time per op, top 12"),
        el("div", { class: "legend" }, el("span", { style: "background: var(--before)" }), "before",
          el("span", { style: "background: var(--after)" }, ""), "after"),
        groupedChart(ops.map((o) => ({ label: str(o.name), before: o.total_us_before, after: o.total_us_after,
          calls: `${count(o.count_before)} → ${count(o.count_after)} calls` }))));
    }
    s.append(...changeList("Findings that vanished", list(diff.findings_vanished)),
      ...changeList("Findings that appeared", list(diff.findings_appeared)));
  }

  // "+3.1% [+1.0%, +5.2%]" from a ratio − 1 and its interval (null ends: unbounded).
  const signedPct = (x) => (isNum(x) ? `${x >= 0 ? "+" : ""}${(x * 100).toFixed(1)}%` : "?");
  function gainText(g, ci) {
    return isNum(g) ? `${signedPct(g)} [${signedPct(list(ci)[0])}, ${signedPct(list(ci)[1])}]` : "–";
  }

  // A folder of rank traces: each rank's step time (the slowest in red), the findings merged
  // across ranks with their spread; the sections below are the slowest rank's trace.
  function renderRankView(data) {
    const ranks = list(data.ranks), slowest = data.slowest_rank || {};
    if (!ranks.length) return;
    const per = data.ranks_per === "step" ? "per step (median)" : "per trace (no steps marked)";
    const s = section(`Ranks (${count(ranks.length)})`, `Time ${per}; rank ${str(slowest.rank)} is the slowest, ` +
      `${fixed(slowest.behind_pct, 1)}% behind the median rank, and the sections below are its trace.`);
    s.id = "ranks";
    s.append(barChart(ranks.map((r) => ({ label: `rank ${r.rank}`, value: r.step_us,
      colour: r.rank === slowest.rank ? "var(--worse)" : undefined }))));
    s.append(table([{ title: "rank" }, { title: "ms", num: true }, { title: "steps", num: true }, { title: "trace" }],
      ranks.map((r) => ({ attrs: { class: "rank-row", "data-rank": str(r.rank) },
        cells: [str(r.rank), ms(r.step_us), count(r.steps), str(r.trace)] }))));
    const found = list(data.rank_findings);
    if (found.length)
      s.append(el("h3", {}, "Findings across ranks"), table([{ title: "rule" }, { title: "replacement" },
        { title: "ranks", num: true }, { title: "time, ms (median)", num: true }, { title: "est. saving, ms (median)", num: true },
        { title: "saving min … max, ms", num: true }],
      found.map((f) => ({ attrs: { class: "rank-finding", "data-rule": str(f.rule) },
        cells: [f.mined ? str(f.pattern) : str(f.rule), str(f.replacement), `${count(f.ranks)}/${count(ranks.length)}`,
          ms(f.time_us_median), ms(f.saving_us_median), `${ms(f.saving_us_min)} … ${ms(f.saving_us_max)}`] }))));
  }

  // Among torch.distributed ranks: each rank's own median step time before and after.
  function renderRanks(s, b, a) {
    const before = list(b.rank_step_ms), after = list(a.rank_step_ms);
    if (!before.length) return;
    const cell = (side, x, r) => `${fixed(x, 2)}${r === side.slowest_rank ? " (slowest)" : ""}`;
    s.append(el("h3", {}, `Ranks (${count(before.length)})`),
      el("p", { class: "note" }, "Each rank's own median step time; a step lasts as long as the slowest rank's, " +
        "which is the step time above."),
      groupedChart(before.map((x, r) => ({ label: `rank ${r}`, before: x, after: after[r], calls: "median" })),
        (v) => `${fixed(v, 2)} ms per step`),
      table([{ title: "rank" }, { title: "baseline, ms", num: true }, { title: "tuned, ms", num: true }],
        before.map((x, r) => ({ attrs: { class: "rank" }, cells: [`rank ${r}`, cell(b, x, r), cell(a, after[r], r)] }))));
  }

  // opfuse tune's result: step time and images/s (derived from it) with their intervals, the
  // measurement's conditions, and the replacements with their verification, gain and decision.
  function renderTune(t) {
    const ranks = t.ranks > 1 ? ` over ${count(t.ranks)} ranks` : "";
    const s = section("Tune: baseline → tuned", `${str(t.model)}, batch ${count(t.batch_size)}${ranks}, ` +
      `rounds of ${count(t.steps)} steps interleaved (${count(t.rounds)} or more while a gain is unclear); ` +
      "changes from paired rounds with 95% intervals.");
    s.id = "tune";
    if (t.measured_under === "torch.compile")
      s.append(el("p", { class: "note" }, "Every variant's timed steps ran under torch.compile (for_compile); " +
        "the profiles and the estimates are of eager steps."));
    const b = t.baseline || {}, a = t.tuned || {};
    const speedup = isNum(t.speedup) ? t.speedup - 1 : null;
    const sci = list(t.speedup_ci).map((x) => (isNum(x) ? x - 1 : null));
    const unit = str(t.sample_unit || "images");
    s.append(el("p", { class: "step" }, `${unit}/s ${fixed(b.images_per_sec, 1)} → ${fixed(a.images_per_sec, 1)} `,
      el("span", { class: t.speedup >= 1 ? "better" : "worse" }, `(${gainText(speedup, sci)})`)));
    const env = t.environment || {}, machine = t.machine || {};
    s.append(el("p", { class: "note" }, `BLAS ${str(env.blas)}; ${count(env.threads)} threads on ${count(env.cores)} cores; ` +
      `cpu path ${str(env.cpu_capability)}; LibTorch ${str(env.torch)}. Others used ` +
      `${isNum(machine.busy_share_of_others) ? (machine.busy_share_of_others * 100).toFixed(0) : "?"}% of the machine while measuring.`));
    list(env.warnings).concat(machine.warning ? [machine.warning] : []).forEach((w) =>
      s.append(el("p", { class: "warning" }, `warning: ${str(w)}`)));
    s.append(groupedChart([{ label: "step time", before: b.step_ms, after: a.step_ms, calls: "median" }],
      (v) => `${fixed(v, 2)} ms per step`));
    const rows = [["step time, ms (median)", `${fixed(b.step_ms, 2)} ${range(b.step_ms_ci)}`, `${fixed(a.step_ms, 2)} ${range(a.step_ms_ci)}`],
      [`${unit}/s (from step time)`, fixed(b.images_per_sec, 1), fixed(a.images_per_sec, 1)],
      ["ops per step", count(b.ops_per_step), count(a.ops_per_step)]];
    if (isNum(b.peak_memory_bytes) && isNum(a.peak_memory_bytes))
      rows.push(["peak memory (profiled)", mb(b.peak_memory_bytes), mb(a.peak_memory_bytes)]);
    list(t.replacements).filter((r) => r.kept && isNum(r.peak_memory_bytes)).forEach((r) =>
      rows.push([`peak memory with ${str(r.rule)} alone (profiled)`, mb(b.peak_memory_bytes), mb(r.peak_memory_bytes)]));
    list(t.rule_times).forEach((r) => {
      rows.push([`${str(r.rule)} small ops per step`, count(r.ops_per_step_before), count(r.ops_per_step_after)]);
      rows.push([`time under ${str(r.rule)} per step (ms, profiled)`, ms(r.us_per_step_before), ms(r.us_per_step_after)]);
    });
    s.append(table([{ title: "" }, { title: "baseline", num: true }, { title: "tuned", num: true }],
      rows.map((cells) => ({ cells }))));
    renderRanks(s, b, a);
    const reps = list(t.replacements).map((r) => ({
      attrs: { class: "replacement", "data-rule": str(r.rule), "data-kept": String(!!r.kept), "data-decision": str(r.decision) },
      cells: [str(r.rule), str(r.rewrite), r.verified ? "yes" : "no", isNum(r.max_rel_error) ? r.max_rel_error.toExponential(1) : "–",
        gainText(r.gain, r.gain_ci), isNum(r.rounds) && r.measured ? count(r.rounds) : "–",
        r.kept_as_group ? "kept (group)" : r.measured ? str(r.decision) : r.kept ? "kept" : "rolled back",
        str(r.why) + (r.estimate_disagrees ? ` (the analysis estimated ${signedPct(r.estimated_gain)})` : "")],
    }));
    s.append(el("h3", {}, "Replacements"), table([{ title: "rule" }, { title: "rewrite" }, { title: "verified" },
      { title: "max rel error", num: true }, { title: "gain [95% CI]", num: true }, { title: "rounds", num: true },
      { title: "result" }, { title: "why" }], reps));
    if (t.compile && typeof t.compile === "object") renderCompile(t.compile);
  }

  // tune's compare_compile: eager, opfuse, torch.compile and opfuse + torch.compile from the same
  // paired rounds, each with the time it took to be ready and its memory peak.
  function renderCompile(c) {
    const s = section("torch.compile beside the tune", `${count(c.rounds)} paired rounds, ${count(c.threads)} threads; ` +
      "speed-ups over eager are medians of the rounds' ratios with 95% intervals.");
    s.id = "compile";
    const variants = list(c.variants).filter((v) => v && typeof v === "object");
    s.append(barChart(variants.filter((v) => isNum(v.ms)).map((v) => ({ label: str(v.variant), value: v.ms * 1000 })),
      (us) => `${fixed(us / 1000, 2)} ms per step`));
    s.append(table([{ title: "variant" }, { title: "ms per step [95% CI]", num: true }, { title: "vs eager [95% CI]", num: true },
      { title: "ready, s", num: true }, { title: "peak memory", num: true }, { title: "error" }],
      variants.map((v) => ({ attrs: { class: "compile-variant", "data-variant": str(v.variant) },
        cells: [str(v.variant), isNum(v.ms) ? `${fixed(v.ms, 2)} ${range(v.ms_ci, 2)}` : "–",
          isNum(v.speedup_vs_first) ? `×${fixed(v.speedup_vs_first, 3)} ${range(v.speedup_vs_first_ci, 3)}` : "–",
          isNum(v.ready_s) ? fixed(v.ready_s, 1) : "–", isNum(v.peak_memory_bytes) ? mb(v.peak_memory_bytes) : "–",
          str(v.error)] }))));
    const paired = c.opfuse_compile_vs_compile;
    if (paired && isNum(paired.estimate))
      s.append(el("p", { class: "step" }, `opfuse + compile against compile alone: ×${fixed(paired.estimate, 3)} ` +
        `${range(paired.ci, 3)}`));
  }

  // --- Timeline of one step -------------------------------------------------------------------
  // Drawn on a canvas: tens of thousands of slices as SVG nodes would make zooming crawl. The
  // figure's data-* attributes say what was drawn, for people's tools and the browser test.
  const PALETTE = ["#e15759", "#f28e2b", "#b07aa1", "#edc948", "#76b7b2", "#ff9da7", "#9c755f", "#59a14f"];
  const HOST_FILL = "#c3cfdc", DEVICE_FILL = "#9db4cc", TL = { label: 180, row: 15, gap: 8, axis: 20, maxRows: 64 };
  const findingKey = (f) => (f ? str(f.rule) === "unnamed chain" || f.mined ? str(f.pattern) : str(f.rule) || str(f.pattern) : "");

  // µs as people read them on a ruler: "250 µs", "1.5 ms".
  function timeText(us) {
    if (!isNum(us)) return "–";
    const a = Math.abs(us);
    if (a >= 1000) return `${(us / 1000).toFixed(a >= 100000 ? 0 : a >= 10000 ? 1 : 2)} ms`;
    return `${us.toFixed(a >= 100 ? 0 : a >= 10 ? 1 : 2)} µs`;
  }

  // The timeline's JSON checked and put in drawing order; bad entries are dropped, never drawn.
  function readTimeline(t, findings) {
    if (!t || typeof t !== "object") return null;
    const lanes = list(t.lanes).map((l) => ({ name: str(l && l.name), device: !!(l && l.device),
      rows: Math.min(TL.maxRows, Math.max(1, isNum(l && l.rows) ? Math.floor(l.rows) : 1)) }));
    const names = list(t.names).map(str);
    const slices = [];
    for (const s of list(t.slices)) {
      if (!Array.isArray(s) || s.length < 4) continue;
      const [lane, row, start, dur, name, module, finding] = s;
      if (!isNum(lane) || !lanes[lane] || !isNum(row) || row < 0 || row >= lanes[lane].rows || !isNum(start) || !isNum(dur)) continue;
      const f = isNum(finding) && finding >= 0 ? findings[finding] : undefined;
      slices.push({ lane, row, start, dur: Math.max(0, dur), name: str(names[name]) || "?",
        module: isNum(module) && module >= 0 ? str(names[module]) : "", finding: f, key: findingKey(f) });
    }
    let top = TL.axis;
    for (const l of lanes) { l.top = top; top += l.rows * TL.row + TL.gap; l.slices = Array.from({ length: l.rows }, () => []); }
    for (const s of slices) lanes[s.lane].slices[s.row].push(s);
    for (const l of lanes) for (const r of l.slices) r.sort((a, b) => a.start - b.start);
    const dur = isNum(t.dur_us) && t.dur_us > 0 ? t.dur_us : Math.max(1, ...slices.map((s) => s.start + s.dur));
    return { lanes, slices, dur, height: top, step: str(t.step), steps: isNum(t.steps) ? t.steps : 0,
      leftOut: isNum(t.slices_left_out) ? t.slices_left_out : 0, max: t.max_slices };
  }

  // "What the colour means": the replacement op in an after-trace is drawn in its finding's colour,
  // so before → after reads as a cloud of small ops → one op.
  function replacementMatches(name, replacement) {
    if (!replacement) return false;
    const last = replacement.split(/::|\./).pop();
    return name === replacement || (last.length > 2 && name.endsWith("::" + last));
  }

  function timelineCaption(tl, path, side) {
    const which = tl.step ? `${tl.step}, the median-length of ${count(tl.steps)} steps (the last, often cut short, left out)` :
      "the whole trace (it has no ProfilerStep# markers)";
    const left = tl.leftOut > 0 ? `; ${count(tl.leftOut)} slices left out (over ${count(tl.max)}: the deepest and shortest)` : "";
    return `${side ? side + ": " : ""}${path || "(unnamed trace)"} — ${which}, ${timeText(tl.dur)}, ` +
      `${count(tl.slices.length)} slices${left}`;
  }

  function drawTimeline(fig, view) {
    const { tl, canvas } = fig;
    const width = canvas.clientWidth || 1100, dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(tl.height * dpr);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, tl.height);
    const plot = width - TL.label, scale = plot / (view.t1 - view.t0);
    const x = (t) => TL.label + (t - view.t0) * scale;
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    tl.lanes.forEach((l, i) => {
      ctx.fillStyle = i % 2 ? "#ffffff" : "#f6f8fa";
      ctx.fillRect(0, l.top - TL.gap / 2, width, l.rows * TL.row + TL.gap);
    });
    // Plain slices first, then the findings' on top: a one-pixel highlight is never painted over.
    const drawSlice = (s, fill) => {
      const l = tl.lanes[s.lane];
      let x0 = x(s.start), x1 = x(s.start + s.dur);
      if (x1 < TL.label || x0 > width) return;
      x0 = Math.max(x0, TL.label);
      const w = Math.max(1, Math.min(x1, width) - x0), y = l.top + s.row * TL.row;
      ctx.fillStyle = fill;
      ctx.fillRect(x0, y, w, TL.row - 2);
      if (w > 36) {
        ctx.fillStyle = "#1f2328";
        const room = Math.floor((w - 6) / 6.2);
        ctx.fillText(s.name.length > room ? s.name.slice(0, Math.max(1, room - 1)) + "…" : s.name, x0 + 3, y + (TL.row - 2) / 2);
      }
    };
    const lit = [];
    for (const s of tl.slices) {
      const c = fig.colourOf(s);
      if (c) lit.push([s, c]);
      else drawSlice(s, tl.lanes[s.lane].device ? DEVICE_FILL : HOST_FILL);
    }
    for (const [s, c] of lit) drawSlice(s, c);
    drawAxis(ctx, view, width, x);
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, TL.axis, TL.label - 1, tl.height);
    ctx.fillStyle = "#1f2328";
    for (const l of tl.lanes) {
      const room = Math.floor((TL.label - 10) / 6.2);
      ctx.fillText(l.name.length > room ? "…" + l.name.slice(-(room - 1)) : l.name, 4, l.top + (TL.row - 2) / 2);
    }
    fig.box = canvas.getBoundingClientRect();
    fig.node.dataset.box = [fig.box.left + window.scrollX, fig.box.top + window.scrollY, fig.box.width, fig.box.height]
      .map((v) => Math.round(v)).join(",");
  }

  // Ticks at 1, 2 or 5 × 10^k µs, about every 100 px.
  function drawAxis(ctx, view, width, x) {
    const span = view.t1 - view.t0, raw = (span * 100) / Math.max(1, width - TL.label);
    const pow = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1e-3))));
    const step = [1, 2, 5, 10].map((m) => m * pow).find((s) => s >= raw) || raw;
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, width, TL.axis - 2);
    ctx.strokeStyle = "#d8dee4";
    ctx.fillStyle = "#656d76";
    for (let t = Math.ceil(view.t0 / step) * step; t <= view.t1; t += step) {
      const px = Math.round(x(t)) + 0.5;
      if (px < TL.label) continue;
      ctx.beginPath();
      ctx.moveTo(px, TL.axis - 6);
      ctx.lineTo(px, TL.axis - 1);
      ctx.stroke();
      ctx.fillText(timeText(t), px + 3, TL.axis / 2 - 2);
    }
  }

  // The slice under a point, or null: the row from y, then the last slice starting before x
  // (a row's slices do not overlap), with a pixel of slack for slices drawn wider than they are.
  function sliceAt(fig, view, px, py) {
    const width = fig.canvas.clientWidth, t = view.t0 + ((px - TL.label) * (view.t1 - view.t0)) / (width - TL.label);
    if (px < TL.label) return null;
    const pixel = (view.t1 - view.t0) / (width - TL.label);
    for (const l of fig.tl.lanes) {
      const row = Math.floor((py - l.top) / TL.row);
      if (row < 0 || row >= l.rows) continue;
      const r = l.slices[row];
      let lo = 0, hi = r.length;
      while (lo < hi) { const mid = (lo + hi) >> 1; if (r[mid].start <= t + pixel) lo = mid + 1; else hi = mid; }
      for (let k = lo - 1; k >= 0 && k >= lo - 3; --k)
        if (r[k].start + Math.max(r[k].dur, pixel) >= t - pixel) return r[k];
      return null;
    }
    return null;
  }

  function sliceText(s) {
    const lines = [`${s.name} — ${timeText(s.dur)} at +${timeText(s.start)}`];
    if (s.module) lines.push(`module ${s.module}`);
    if (s.finding) lines.push(`finding ${findingLabel(s.finding)}`);
    else if (s.replacing) lines.push(`the replacement of ${s.replacing}`);
    return lines;
  }

  // Wheel zooms at the pointer, drag pans, a click pins a slice's details; all timelines share `view`.
  function wireTimeline(fig, view, redraw) {
    const { canvas, tip, detail } = fig;
    const local = (ev) => { const b = canvas.getBoundingClientRect(); return [ev.clientX - b.left, ev.clientY - b.top]; };
    canvas.addEventListener("wheel", (ev) => {
      const [px] = local(ev);
      if (Math.abs(ev.deltaX) > Math.abs(ev.deltaY)) {
        view.pan((ev.deltaX * (view.t1 - view.t0)) / canvas.clientWidth);
      } else {
        view.zoom(Math.exp(ev.deltaY * 0.002), view.t0 + ((px - TL.label) / (canvas.clientWidth - TL.label)) * (view.t1 - view.t0));
      }
      ev.preventDefault();
      redraw();
    }, { passive: false });
    let drag = null;
    canvas.addEventListener("pointerdown", (ev) => { drag = { x: ev.clientX, moved: false }; canvas.setPointerCapture(ev.pointerId); });
    canvas.addEventListener("pointermove", (ev) => {
      if (drag) {
        const dx = ev.clientX - drag.x;
        if (Math.abs(dx) > 2) drag.moved = true;
        if (drag.moved) {
          view.pan((-dx * (view.t1 - view.t0)) / (canvas.clientWidth - TL.label));
          drag.x = ev.clientX;
          redraw();
        }
        return;
      }
      const [px, py] = local(ev), s = sliceAt(fig, view, px, py);
      tip.style.display = s ? "block" : "none";
      if (s) {
        tip.replaceChildren(...sliceText(s).map((line) => el("div", {}, line)));
        tip.style.left = `${Math.min(px + 12, canvas.clientWidth - 300)}px`;
        tip.style.top = `${py + canvas.offsetTop + 14}px`;
      }
    });
    canvas.addEventListener("pointerleave", () => { tip.style.display = "none"; });
    canvas.addEventListener("pointerup", (ev) => {
      const click = drag && !drag.moved;
      drag = null;
      if (!click) return;
      const [px, py] = local(ev), s = sliceAt(fig, view, px, py);
      detail.textContent = s ? sliceText(s).join("; ") : "";
    });
  }

  function makeView(span) {
    const view = { t0: 0, t1: span, span };
    const clamp = () => {
      const w = Math.min(view.span, Math.max(0.5, view.t1 - view.t0));
      view.t0 = Math.min(Math.max(0, view.t0), view.span - w);
      view.t1 = view.t0 + w;
    };
    view.zoom = (factor, at) => {
      view.t0 = at - (at - view.t0) * factor;
      view.t1 = at + (view.t1 - at) * factor;
      clamp();
    };
    view.pan = (dt) => { view.t0 += dt; view.t1 += dt; clamp(); };
    view.reset = () => { view.t0 = 0; view.t1 = view.span; };
    return view;
  }

  // One timeline, or before and after stacked on one time scale, findings coloured alike in both.
  function renderTimelines(data) {
    const before = data.timeline, after = data.diff && data.diff.after && data.diff.after.timeline;
    if (!before && !after) return;
    const beforeFindings = list(data.findings), afterFindings = list(data.diff && data.diff.after && data.diff.after.findings);
    const colours = new Map();
    for (const f of beforeFindings.concat(afterFindings)) {
      const key = findingKey(f);
      if (key && !colours.has(key)) colours.set(key, PALETTE[colours.size % PALETTE.length]);
    }
    const sides = [];
    const tlBefore = readTimeline(before, beforeFindings), tlAfter = readTimeline(after, afterFindings);
    if (tlBefore) sides.push({ tl: tlBefore, path: str((data.trace || {}).path), side: tlAfter ? "before" : "" });
    if (tlAfter) sides.push({ tl: tlAfter, path: str(((data.diff.after || {}).trace || {}).path), side: "after" });
    if (!sides.length) return;
    const s = section("Timeline of one step", "Host threads and device streams as lanes, nested ops as rows below " +
      "their parent. Slices of a finding's chains (and, on device, the kernels they launched) in the finding's colour" +
      (tlAfter ? "; in the after trace, the ops that replaced them in the same colour. Both on one time scale." : "."));
    s.id = "timeline";
    const replaced = beforeFindings.filter((f) => f.replacement).map((f) => ({ f, key: findingKey(f) }));
    const view = makeView(Math.max(...sides.map((x) => x.tl.dur)));
    const figs = [];
    const redraw = () => figs.forEach((fig) => drawTimeline(fig, view));
    const tools = el("div", { class: "timeline-tools" });
    const button = (label, act) => { const b = el("button", { type: "button" }, label); b.addEventListener("click", () => { act(); redraw(); }); return b; };
    const mid = () => (view.t0 + view.t1) / 2;
    tools.append(button("zoom in", () => view.zoom(0.5, mid())), button("zoom out", () => view.zoom(2, mid())),
      button("reset", () => view.reset()), "wheel: zoom at the pointer · drag: pan · hover or click a slice: details");
    s.append(tools);
    const used = new Map();  // finding key → slices drawn in its colour, over all timelines
    for (const side of sides) {
      const tl = side.tl;
      for (const sl of tl.slices) {
        if (!sl.finding && side.side === "after") {
          const r = replaced.find((x) => replacementMatches(sl.name, x.f.replacement));
          if (r) { sl.key = r.key; sl.replacing = findingLabel(r.f); }
        }
        if (sl.key && colours.has(sl.key)) used.set(sl.key, (used.get(sl.key) || 0) + 1);
      }
      const canvas = el("canvas", { role: "img", "aria-label": `timeline of ${side.side || "the trace"}` });
      canvas.style.height = `${tl.height}px`;
      const node = el("figure", { class: "timeline", "data-trace": side.side || "trace", "data-slices": String(tl.slices.length) },
        el("figcaption", {}, timelineCaption(tl, side.path, side.side)), canvas);
      const tip = el("div", { class: "timeline-tip" }), detail = el("div", { class: "timeline-detail muted" });
      node.append(tip, detail);
      const highlighted = new Map();
      for (const sl of tl.slices) if (sl.key && colours.has(sl.key)) highlighted.set(sl.key, (highlighted.get(sl.key) || 0) + 1);
      node.dataset.highlighted = [...highlighted].map(([k, n]) => `${k}:${n}`).join(",");
      s.append(node);
      const fig = { tl, canvas, tip, detail, node, colourOf: (sl) => (sl.key ? colours.get(sl.key) : undefined) };
      figs.push(fig);
      wireTimeline(fig, view, redraw);
    }
    const legend = el("div", { class: "legend timeline-legend" },
      el("span", { class: "swatch", style: `background: ${HOST_FILL}` }), "host",
      el("span", { class: "swatch", style: `background: ${DEVICE_FILL}` }), "device");
    for (const f of beforeFindings.concat(afterFindings)) {
      const key = findingKey(f);
      if (!used.has(key) || legend.querySelector(`[data-key="${CSS.escape(key)}"]`)) continue;
      legend.append(el("span", { class: "swatch timeline-finding", "data-key": key, "data-rule": str(f.rule),
        "data-colour": colours.get(key), "data-slices": String(used.get(key)), style: `background: ${colours.get(key)}` }),
        `${findingLabel(f)} (${count(used.get(key))} slices)`);
    }
    tools.after(legend);
    redraw();
    window.addEventListener("resize", redraw);
  }

  // --- Device: temporal breakdown, streams, kernels -------------------------------------------
  function pctChart(rows) {
    const chart = barChart(rows.map((r) => ({ label: r.label, value: isNum(r.pct) ? r.pct * 1000 : 0, colour: r.colour })));
    // barChart prints ms of its value; these are percentages, so the value labels are rewritten.
    chart.querySelectorAll("text.value").forEach((t, i) => { t.textContent = `${fixed(rows[i].pct, 1)}%`; });
    chart.querySelectorAll("title").forEach((t, i) => { t.textContent = `${rows[i].label}: ${fixed(rows[i].pct, 1)}%`; });
    return chart;
  }

  function renderDevice(device, devices, kernels) {
    if (!device || typeof device !== "object" || !device.breakdown) return;
    const per = device.per === "step" ? "per step" : "in the trace";
    const s = section("Device time", `Device ${str(device.device)}: a ${ms(device.window_us)} ms window ${per} ` +
      `(HolisticTraceAnalysis' convention), ${ms(device.busy_us)} ms busy, ${ms(device.idle_us)} ms idle` +
      (list(devices).length > 1 ? `; the busiest of ${list(devices).length} devices.` : "."));
    s.id = "device";
    const b = device.breakdown;
    s.append(el("h3", {}, "Temporal breakdown (% of the window)"),
      pctChart([{ label: "compute", pct: b.compute_pct, colour: "var(--bar)" },
        { label: "communication", pct: b.communication_pct, colour: "#f28e2b" },
        { label: "memcpy / memset", pct: b.memory_pct, colour: "#76b7b2" },
        { label: "idle", pct: b.idle_pct, colour: "var(--other)" }]));
    const streams = list(device.streams);
    if (streams.length)
      s.append(el("h3", {}, `Busy time per stream (ms ${per})`),
        barChart(streams.slice(0, 12).map((st) => ({ label: `stream ${str(st.stream)}`, value: st.busy_us }))));
    const top = list(kernels && kernels.top);
    if (top.length) {
      const kper = kernels.per === "step" ? "per step" : "in the trace";
      s.append(el("h3", {}, `Kernel time, top ${Math.min(15, top.length)} of ${count(kernels.count)} (ms ${kper})`),
        barChart(top.slice(0, 15).map((k) => ({ label: str(k.name), value: k.total_us }))));
    }
    const l = device.launch || {};
    if (isNum(l.kernels) && l.kernels > 0)
      s.append(el("p", { class: "note" }, `Launches: ${fixed(l.delay_median_us, 1)} µs median from launch to start ` +
        `(p90 ${fixed(l.delay_p90_us, 1)} µs); ${count(l.shorter_than_launch)} of ${count(l.launched)} kernels ran shorter ` +
        `than their launch call; ${fixed(l.small_kernel_time_pct, 1)}% of kernel time in kernels under ${fixed(l.small_kernel_us, 0)} µs.`));
    // Ascend's own split of the device's time: shown as the profiler gives it, over the whole trace.
    const overlap = device.overlap_analysis;
    if (overlap && list(overlap.lanes).length)
      s.append(el("h3", {}, `The profiler's Overlap Analysis (% of its ${ms(overlap.span_us)} ms, whole trace)`),
        pctChart(list(overlap.lanes).map((l) => ({ label: str(l.name), pct: l.pct, colour: "var(--other)" }))));
  }

  // --- Memory: the allocator's total over the profile, and who holds its peak ------------------

  // The total as a line over the profile's time, its peak marked.
  function memoryCurve(points, peakAt, peak) {
    const H = 180, PAD = 40, first = points[0][0], last = points[points.length - 1][0];
    const top = Math.max(1, ...points.map((p) => p[1])), span = Math.max(1e-9, last - first);
    const x = (us) => PAD + ((us - first) / span) * (W - 2 * PAD), y = (b) => H - 20 - (b / top) * (H - 40);
    const chart = svgEl("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img" });
    chart.append(svgEl("title", {}, `allocated memory over the profile; peak ${mb(peak)} at ${ms(peakAt)} ms`));
    const d = points.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
    chart.append(svgEl("path", { d, fill: "none", stroke: "var(--bar)", "stroke-width": 1.5 }));
    chart.append(svgEl("circle", { cx: x(peakAt).toFixed(1), cy: y(peak).toFixed(1), r: 4, fill: "var(--save)" }));
    chart.append(svgEl("text", { x: Math.min(W - 150, x(peakAt) + 8), y: y(peak) + 4 }, `peak ${mb(peak)}`));
    chart.append(svgEl("line", { x1: PAD, y1: y(0), x2: W - PAD, y2: y(0), stroke: "var(--other)" }));
    chart.append(svgEl("text", { x: PAD - 6, y: y(0) + 4, "text-anchor": "end" }, "0"));
    chart.append(svgEl("text", { x: PAD, y: H - 4 }, `${ms(first)} ms`));
    chart.append(svgEl("text", { x: W - PAD, y: H - 4, "text-anchor": "end" }, `${ms(last)} ms`));
    return chart;
  }

  function renderMemory(memory) {
    for (const d of list(memory)) {
      if (!d || !isNum(d.peak_bytes)) continue;
      const where = [str(d.peak_step), str(d.peak_op)].filter((w) => w).join(", ");
      const s = section(`Memory (${str(d.device)})`, `Peak ${mb(d.peak_bytes)} at ${ms(d.peak_at_us)} ms` +
        (where ? ` (${where})` : "") + `; ${count(d.allocations)} allocations and ${count(d.frees)} frees recorded.`);
      s.id = `memory-${str(d.device)}`;
      const points = list(d.timeline).filter((p) => Array.isArray(p) && isNum(p[0]) && isNum(p[1]));
      if (points.length > 1) s.append(el("h3", {}, "Allocated over the profile"), memoryCurve(points, d.peak_at_us, d.peak_bytes));
      for (const [title, rows] of [["Held at the peak", d.by_phase], ["By module", d.by_module], ["By op", d.by_op]])
        if (list(rows).length)
          s.append(el("h3", {}, title), barChart(list(rows).slice(0, 12).map((r) => ({ label: str(r.name), value: r.bytes })), mb));
    }
  }

  // --- Time per module ------------------------------------------------------------------------
  function renderModules(modules) {
    const top = list(modules && modules.top);
    if (!top.length) return;
    const per = modules.per === "step" ? "per step" : "in the trace";
    const s = section("Time per module", `Host time inside each module scope (ms ${per}), nested scopes counted in ` +
      `their parent too; top 15 of ${count(modules.count)}.`);
    s.id = "modules";
    s.append(barChart(top.slice(0, 15).map((m) => ({ label: str(m.module), value: m.total_us }))));
  }

  const trace = data.trace || {};
  // Findings and ops are per step where the trace's steps are known (the figure to hold against
  // step time), else whole-trace totals, and every column says which.
  const STEPS = isNum(trace.steps) && trace.steps > 0 ? trace.steps : 0;
  const UNIT = STEPS ? "ms/step" : "ms, whole trace";
  const perStep = (us) => (isNum(us) && STEPS ? us / STEPS : us);
  const ops = list(data.ops);
  document.title = `opfuse analysis: ${str(trace.path) || "trace"}`;
  renderHeader(trace, data.device);
  renderRankView(data);
  if (data.tune) renderTune(data.tune);
  renderTimelines(data);
  renderOpChart(ops, str(trace.backend));
  renderFindings(list(data.findings));
  renderDevice(data.device, data.devices, data.kernels);
  renderModules(data.modules);
  renderMemory(data.memory);
  // The comparison is the result when there is one, so it comes before the long op table.
  if (data.diff) renderDiff(data.diff);
  renderOps(ops);
})();
</script>
</body>
</html>
)page";

constexpr std::string_view kSlot = "@ANALYSIS@";

// Inside <script>, "</" could close the element and "<!--" could switch the HTML parser into
// its escaped mode; both only occur inside JSON strings, where "\/" and "\u003c" read the same.
std::string script_safe_json(const nlohmann::json& analysis) {
  const std::string json = analysis.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(json.size());
  for (size_t i = 0; i < json.size(); ++i) {
    if (json[i] == '<' && json.compare(i, 2, "</") == 0) {
      out += "<\\/";
      ++i;
    } else if (json[i] == '<' && json.compare(i, 4, "<!--") == 0) {
      out += "\\u003c";
    } else {
      out += json[i];
    }
  }
  return out;
}

}  // namespace

std::string analysis_html(const nlohmann::json& analysis) {
  const size_t slot = kPage.find(kSlot);
  std::string page(kPage.substr(0, slot));
  page += script_safe_json(analysis);
  page += kPage.substr(slot + kSlot.size());
  return page;
}

}  // namespace opfuse::report
