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

  // Horizontal bars: rows [{label, value (us), colour}], the label column clipped, full name in <title>.
  function barChart(rows) {
    const max = Math.max(1e-9, ...rows.map((r) => (isNum(r.value) ? r.value : 0)));
    const span = W - LABEL - VALUE;
    const chart = svgEl("svg", { class: "chart", viewBox: `0 0 ${W} ${rows.length * ROW + 4}`, role: "img" });
    rows.forEach((r, i) => {
      const y = i * ROW + 2, v = isNum(r.value) ? r.value : 0, w = v > 0 ? Math.max(1, (v / max) * span) : 0;
      const g = svgEl("g", {});
      g.append(svgEl("title", {}, `${r.label}: ${ms(r.value)} ms`));
      g.append(svgEl("text", { x: LABEL - 8, y: y + BAR - 2, "text-anchor": "end" }, clip(r.label, 48)));
      g.append(svgEl("rect", { x: LABEL, y, width: w.toFixed(1), height: BAR, rx: 2, fill: r.colour || "var(--bar)" }));
      g.append(svgEl("text", { class: "value", x: LABEL + w + 6, y: y + BAR - 2 }, `${ms(r.value)} ms`));
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
      meta("steps", count(trace.steps)), meta("step time (traced)", `${ms(trace.step_us)} ms`),
      meta("skipped events", count(trace.skipped_events), trace.skipped_events > 0));
    if (device) {
      const per = device.per === "step" ? " per step" : "";
      const busy = isNum(device.busy_us) ? device.busy_us : device.kernel_us;
      grid.append(meta("device busy", `${ms(busy)} ms${per}`), meta("device idle", `${ms(device.idle_us)} ms${per}`));
    }
    h.append(grid);
  }

  function renderOpChart(ops) {
    const bySelf = [...ops].sort((a, b) => (b.self_us || 0) - (a.self_us || 0));
    const rows = bySelf.slice(0, 15).map((o) => ({ label: str(o.name), value: o.self_us }));
    const rest = bySelf.slice(15).reduce((sum, o) => sum + (isNum(o.self_us) ? o.self_us : 0), 0);
    if (rest > 0) rows.push({ label: `other (${bySelf.length - 15} ops)`, value: rest, colour: "var(--other)" });
    const s = section("Where the time goes", "Self time per op (time not spent in child ops), top 15.");
    s.append(rows.length ? barChart(rows) : el("p", { class: "muted" }, "No ops in this trace."));
  }

  function renderFindings(findings) {
    const s = section("Findings", "Estimated saving if each pattern were replaced by its fused op.");
    if (!findings.length) {
      s.append(el("p", { class: "muted" }, "No fusable patterns found."));
      return;
    }
    const bySaving = [...findings].sort((a, b) => (b.est_saving_us || 0) - (a.est_saving_us || 0));
    s.append(barChart(bySaving.map((f) => ({ label: findingLabel(f), value: f.est_saving_us, colour: "var(--save)" }))));
    const columns = [{ title: "rule" }, { title: "pattern" }, { title: "replacement" }, { title: "backend" },
      { title: "occurrences", num: true }, { title: "time (ms)", num: true }, { title: "est. saving (ms)", num: true },
      { title: "locations" }];
    const rows = findings.map((f) => ({
      attrs: { class: "finding", "data-rule": str(f.rule) },
      cells: [str(f.rule) || str(f.kind), str(f.pattern), str(f.replacement) || "–", str(f.backend),
        count(f.occurrences), ms(f.time_us), ms(f.est_saving_us), locations(f)],
    }));
    s.append(el("h3", {}, "All findings"), table(columns, rows));
  }

  function renderOps(ops) {
    const TOP = 30;
    const bySelf = [...ops].sort((a, b) => (b.self_us || 0) - (a.self_us || 0)).slice(0, TOP);
    const s = section("Top ops", `By self time; ${Math.min(TOP, ops.length)} of ${ops.length} ops.`);
    if (!bySelf.length) return;
    const hasDevice = ops.some((o) => isNum(o.device_us));
    const columns = [{ title: "name" }, { title: "count", num: true }, { title: "total ms", num: true },
      { title: "self ms", num: true }, { title: "mean us", num: true }];
    if (hasDevice) columns.push({ title: "device ms", num: true });
    s.append(table(columns, bySelf.map((o) => {
      const cells = [str(o.name), count(o.count), ms(o.total_us), ms(o.self_us), fixed(o.mean_us, 2)];
      if (hasDevice) cells.push(ms(o.device_us));
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
    const range = (ci) => `[${list(ci).map((x) => fixed(x, 2)).join(", ")}]`;
    const rows = [["step time, ms (median)", `${fixed(b.step_ms, 2)} ${range(b.step_ms_ci)}`, `${fixed(a.step_ms, 2)} ${range(a.step_ms_ci)}`],
      [`${unit}/s (from step time)`, fixed(b.images_per_sec, 1), fixed(a.images_per_sec, 1)],
      ["ops per step", count(b.ops_per_step), count(a.ops_per_step)]];
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
        r.measured ? str(r.decision) : r.kept ? "kept" : "rolled back",
        str(r.why) + (r.estimate_disagrees ? ` (the analysis estimated ${signedPct(r.estimated_gain)})` : "")],
    }));
    s.append(el("h3", {}, "Replacements"), table([{ title: "rule" }, { title: "rewrite" }, { title: "verified" },
      { title: "max rel error", num: true }, { title: "gain [95% CI]", num: true }, { title: "rounds", num: true },
      { title: "result" }, { title: "why" }], reps));
  }

  const trace = data.trace || {};
  const ops = list(data.ops);
  document.title = `opfuse analysis: ${str(trace.path) || "trace"}`;
  renderHeader(trace, data.device);
  renderRankView(data);
  if (data.tune) renderTune(data.tune);
  renderOpChart(ops);
  renderFindings(list(data.findings));
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
