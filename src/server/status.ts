/**
 * The status page at `/`: one self-contained HTML document that polls the JSON API
 * (/v1/workers) and shows each worker's connection, trust, cached blocks and load.
 */
const PAGE = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>kvedge</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 2rem; color: #1d1d1f; }
  h1 { font-size: 1.3rem; margin: 0 0 .25rem; }
  #summary { color: #555; margin-bottom: 1rem; }
  table { border-collapse: collapse; min-width: 60rem; }
  th, td { text-align: right; padding: .3rem .6rem; border-bottom: 1px solid #ddd; }
  th:first-child, td:first-child, td.text, th.text { text-align: left; }
  .bad { color: #b00020; font-weight: 600; }
  .ok { color: #0a7d32; }
</style>
</head>
<body>
<h1>kvedge</h1>
<div id="summary">loading…</div>
<table>
  <thead><tr>
    <th>worker</th><th>dp</th><th class="text">endpoint</th><th class="text">state</th><th class="text">trust</th>
    <th>cached blocks</th><th>active requests</th><th>prefill tokens</th><th>decode blocks</th><th>routed</th>
    <th>last seq</th><th>lost batches</th>
  </tr></thead>
  <tbody id="workers"></tbody>
</table>
<script>
const cell = (text, cls) => { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; return td; };
async function refresh() {
  try {
    const response = await fetch("/v1/workers");
    const body = await response.json();
    const rows = body.workers.map((w) => {
      const tr = document.createElement("tr");
      tr.append(cell(w.worker_id), cell(w.dp_rank), cell(w.endpoint ?? "—", "text"),
        cell(w.state, w.state === "connected" ? "text ok" : "text bad"),
        cell(w.degraded ? "degraded" : "exact", w.degraded ? "text bad" : "text ok"),
        cell(w.blocks), cell(w.active_requests), cell(Math.round(w.active_prefill_tokens)),
        cell(Math.round(w.active_decode_blocks)), cell(w.routed_total), cell(w.last_seq), cell(w.lost_batches));
      return tr;
    });
    document.getElementById("workers").replaceChildren(...rows);
    const blocks = body.workers.reduce((sum, w) => sum + w.blocks, 0);
    const active = body.workers.reduce((sum, w) => sum + w.active_requests, 0);
    document.getElementById("summary").textContent =
      body.workers.length + " workers · block size " + body.block_size + " · " + blocks + " cached blocks · "
      + active + " active requests · updated " + new Date().toLocaleTimeString();
  } catch (error) {
    document.getElementById("summary").textContent = "cannot reach kvedge: " + error;
  }
}
refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
`;

export function statusPage(): string {
  return PAGE;
}
