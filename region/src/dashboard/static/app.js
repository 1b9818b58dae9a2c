// gshare dashboard: reads the token from the URL fragment (#token=...) and
// polls the replica's /v1 API with it. No library, nothing fetched from
// elsewhere. Every figure shown is also in a data-* attribute of its
// element (the browser test reads those).
"use strict";
(function () {
  const POLL_MS = 2000;
  const HEARTBEAT_STALE_MS = 10000;
  const EVENTS_SHOWN = 40;
  const token = new URLSearchParams(location.hash.slice(1)).get("token") || "";
  const $ = (id) => document.getElementById(id);
  let mode = null; // "operator" | "tenant"
  let polls = 0;
  let seen = null; // instance id -> label, from the previous poll
  const pageEvents = []; // releases (and a tenant's placements) seen by the page

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(path) {
    const r = await fetch(path, {
      headers: { Authorization: "Bearer " + token },
      cache: "no-store",
    });
    let body = null;
    try {
      body = await r.json();
    } catch (_) {
      body = null;
    }
    if (!r.ok) {
      const e = (body && body.error) || {};
      throw new ApiError(r.status, e.code || "", e.message || "HTTP " + r.status);
    }
    return body;
  }

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === "class") e.className = v;
      else if (k === "style") e.setAttribute("style", v);
      else e.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  const fmt = (n, digits) =>
    n === null || n === undefined || Number.isNaN(n) ? "–" : Number(n).toFixed(digits);
  const ms = (us) => (us === null || us === undefined ? null : us / 1000);
  const pct = (a, b) => (b > 0 ? (100 * a) / b : null);

  // ----- what the API gives, in one shape for both callers -----

  function gpusOfNode(node) {
    // The topology lists GPU groups; indices count across them in order.
    const out = [];
    let index = 0;
    for (const g of node.gpus || []) {
      for (let i = 0; i < g.count; i += 1) {
        out.push({ index, model: g.model, memory_mib: g.memory_mib });
        index += 1;
      }
    }
    return out;
  }

  function instanceState(inst, link, events) {
    if (!link || link.heartbeat_at_ms === null || link.heartbeat_at_ms === undefined) {
      return "unknown";
    }
    const resident = link.gpus.some((g) => g.resident.includes(inst.id));
    const loading = events.some(
      (e) =>
        e.instance === inst.id &&
        (e.kind === "swap_in" || e.kind === "cold_start" || e.kind === "move") &&
        e.at_ms + e.duration_us / 1000 > link.heartbeat_at_ms,
    );
    if (loading) return "loading";
    return resident ? "resident" : "swapped-out";
  }

  function buildModel(m) {
    // m: { cluster, activity, pools:[{name, kind, nodes:[{name, gpus:[{index, model, memory_mib}], drained}]}],
    //      instances:[{id, tenant, function, tier, pool, slices, placed_at}], functions:[spec], bills:[bill] }
    const links = new Map(m.activity.agents.map((a) => [a.node, a]));
    const byGpu = new Map();
    for (const inst of m.instances) {
      const link = links.get(inst.slices.length ? inst.slices[0].gpu.node : "");
      const state = instanceState(inst, link, m.activity.events);
      for (const s of inst.slices) {
        const k = s.gpu.node + "/" + s.gpu.index;
        if (!byGpu.has(k)) byGpu.set(k, []);
        byGpu.get(k).push({
          instance: inst.id,
          tenant: inst.tenant,
          function: inst.function,
          tier: inst.tier,
          state,
          compute_milli: s.compute_milli,
          memory_mib: s.memory_mib,
        });
      }
    }
    const pools = m.pools.map((p) => ({
      name: p.name,
      kind: p.kind,
      nodes: p.nodes.map((n) => {
        const link = links.get(n.name) || null;
        const age =
          link && link.heartbeat_at_ms !== null ? m.activity.now_ms - link.heartbeat_at_ms : null;
        let state = "not-ready";
        if (n.drained) state = "drained";
        else if (age !== null && age <= HEARTBEAT_STALE_MS) state = "ready";
        return {
          name: n.name,
          state,
          link,
          age,
          gpus: n.gpus.map((g) => {
            const live = link ? link.gpus.find((x) => x.index === g.index) : null;
            const slices = byGpu.get(n.name + "/" + g.index) || [];
            return {
              index: g.index,
              model: g.model,
              memory_mib: g.memory_mib,
              slices,
              compute_held: slices.reduce((a, s) => a + s.compute_milli, 0),
              memory_held: slices.reduce((a, s) => a + s.memory_mib, 0),
              utilization_milli: live ? live.utilization_milli : null,
              memory_used_mib: live ? live.memory_used_mib : null,
              measured_pct: live ? live.measured_utilization_pct : null,
              queued: live ? live.queued : null,
            };
          }),
        };
      }),
    }));
    const stats = new Map(m.activity.functions.map((f) => [f.tenant + "/" + f.function, f]));
    const metered = new Map();
    for (const b of m.bills) {
      for (const f of b.functions || []) {
        metered.set(b.tenant + "/" + f.function, f.usage.invocations);
      }
    }
    const functions = m.functions.map((spec) => {
      const key = spec.tenant + "/" + spec.name;
      return {
        spec,
        current: m.instances.filter((i) => i.tenant === spec.tenant && i.function === spec.name)
          .length,
        stats: stats.get(key) || null,
        metered: metered.has(key) ? metered.get(key) : 0,
      };
    });
    const tenants = m.bills.map((b) => {
      const sum = { invocations: 0, compute: 0, memory: 0 };
      for (const l of b.lines || []) {
        sum.invocations += l.usage.invocations;
        sum.compute += l.usage.compute_milli_gpu_ms;
        sum.memory += l.usage.memory_mib_ms;
      }
      return { name: b.tenant, total: b.total, unit: b.unit, ...sum };
    });
    const events = m.instances
      .filter((i) => i.placed_at !== undefined)
      .map((i) => ({
        at_ms: i.placed_at,
        kind: "placed",
        tenant: i.tenant,
        function: i.function,
        instance: i.id,
        node: i.slices.length ? i.slices[0].gpu.node : "",
        detail: i.slices.map((s) => "gpu" + s.gpu.index).join(","),
      }))
      .concat(
        m.activity.events.map((e) => ({
          at_ms: e.at_ms,
          kind: e.kind,
          tenant: e.tenant,
          function: e.function,
          instance: e.instance,
          node: e.node,
          detail:
            (e.from_gpu !== null ? "gpu" + e.from_gpu : "") +
            (e.from_gpu !== null && e.to_gpu !== null ? "→" : "") +
            (e.to_gpu !== null ? "gpu" + e.to_gpu : "") +
            (e.duration_us ? " " + fmt(e.duration_us / 1000, 1) + " ms" : ""),
        })),
      )
      .concat(pageEvents)
      .sort((a, b) => b.at_ms - a.at_ms)
      .slice(0, EVENTS_SHOWN);
    return { pools, functions, tenants, events };
  }

  function notePageEvents(instances, withPlacements) {
    const now = Date.now();
    const current = new Map(
      instances.map((i) => [
        i.id,
        {
          tenant: i.tenant,
          function: i.function,
          node: i.slices.length ? i.slices[0].gpu.node : "",
        },
      ]),
    );
    if (seen !== null) {
      for (const [id, i] of seen) {
        if (!current.has(id)) pageEvents.push({ at_ms: now, kind: "released", instance: id, detail: "", ...i });
      }
      if (withPlacements) {
        for (const [id, i] of current) {
          if (!seen.has(id)) pageEvents.push({ at_ms: now, kind: "placed", instance: id, detail: "", ...i });
        }
      }
    }
    seen = current;
    while (pageEvents.length > EVENTS_SHOWN) pageEvents.shift();
  }

  // A tenant's all-time bill across price lists in different units has no
  // total (422 mixed_units): its row says so, the rest of the page draws.
  function unbilled(e, tenant) {
    if (!(e instanceof ApiError && e.code === "mixed_units")) throw e;
    return { tenant, total: "no total (price lists in different units)", unit: "", lines: [], functions: [] };
  }

  async function operatorModel(cluster) {
    const [state, activity] = await Promise.all([api("/v1/cluster/state"), api("/v1/activity")]);
    const tenants = Object.keys(state.tenants || {});
    const bills = await Promise.all(
      tenants.map((t) =>
        api("/v1/tenants/" + encodeURIComponent(t) + "/bill").catch((e) => unbilled(e, t)),
      ),
    );
    const drained = state.drained || {};
    const topo = state.topology || { pools: [] };
    const pools = topo.pools.map((p) => ({
      name: p.name,
      kind: p.kind,
      nodes: p.nodes.map((n) => ({ name: n.name, gpus: gpusOfNode(n), drained: n.name in drained })),
    }));
    const instances = Object.values(state.instances || {});
    const functions = [];
    for (const byName of Object.values(state.functions || {})) {
      for (const rec of Object.values(byName)) functions.push(rec.spec);
    }
    notePageEvents(instances, false);
    return { cluster, activity, pools, instances, functions, bills };
  }

  async function tenantModel(cluster) {
    const [views, activity, bill] = await Promise.all([
      api("/v1/functions"),
      api("/v1/activity"),
      api("/v1/bill").catch((e) => unbilled(e, "")),
    ]);
    const instances = [];
    const functions = [];
    for (const v of views) {
      functions.push(v.spec);
      for (const i of v.instances) {
        instances.push({
          id: i.instance,
          tenant: v.spec.tenant,
          function: v.spec.name,
          tier: v.spec.tier,
          pool: i.pool,
          slices: i.slices,
        });
      }
    }
    // A tenant sees the nodes that host its instances, as the agents registered them.
    const poolMap = new Map();
    const nodeSeen = new Set();
    const addNode = (pool, name, gpus) => {
      if (nodeSeen.has(name)) return;
      nodeSeen.add(name);
      if (!poolMap.has(pool)) poolMap.set(pool, { name: pool, kind: "", nodes: [] });
      poolMap.get(pool).nodes.push({ name, gpus, drained: false });
    };
    for (const a of activity.agents) {
      addNode(
        a.pool,
        a.node,
        a.gpus.map((g) => ({ index: g.index, model: g.model, memory_mib: g.memory_mib })),
      );
    }
    for (const i of instances) {
      for (const s of i.slices) {
        if (!nodeSeen.has(s.gpu.node)) {
          const idx = new Set(
            instances.flatMap((j) => j.slices.filter((x) => x.gpu.node === s.gpu.node).map((x) => x.gpu.index)),
          );
          addNode(
            i.pool,
            s.gpu.node,
            [...idx].sort((a, b) => a - b).map((index) => ({ index, model: "", memory_mib: null })),
          );
        }
      }
    }
    for (const p of poolMap.values()) p.nodes.sort((a, b) => (a.name < b.name ? -1 : 1));
    const pools = [...poolMap.values()].sort((a, b) => (a.name < b.name ? -1 : 1));
    notePageEvents(instances, true);
    return { cluster, activity, pools, instances, functions, bills: [bill] };
  }

  // ----- drawing -----

  function drawGpu(node, g) {
    // Memory can be oversubscribed (swapped-out weights stay placed): the
    // bar then spans what is held, so every slice keeps its share.
    const memTotal = Math.max(g.memory_mib || 0, g.memory_held, 1);
    const computeScale = Math.max(1000, g.compute_held);
    const mem = el("div", { class: "bar memory", title: "memory held" });
    const cmp = el("div", { class: "bar compute", title: "compute held" });
    for (const s of g.slices) {
      const common = {
        "data-instance": s.instance,
        "data-tenant": s.tenant,
        "data-function": s.function,
        "data-tier": s.tier,
        "data-state": s.state,
        "data-compute-milli": s.compute_milli,
        "data-memory-mib": s.memory_mib,
      };
      const title =
        s.tenant + "/" + s.function + " #" + s.instance + " · " + s.tier + " · " + s.state +
        " · " + s.memory_mib + " MiB · " + s.compute_milli + " milli-GPU";
      mem.append(
        el(
          "div",
          {
            class: "slice tier-" + s.tier + " state-" + s.state,
            style: "width:" + (100 * s.memory_mib) / memTotal + "%",
            title,
            ...common,
          },
          s.function,
        ),
      );
      cmp.append(
        el("div", {
          class: "cslice tier-" + s.tier + " state-" + s.state,
          style: "width:" + (100 * s.compute_milli) / computeScale + "%",
          title,
          "data-instance": s.instance,
        }),
      );
    }
    if (g.utilization_milli !== null && g.utilization_milli !== undefined) {
      cmp.append(
        el("div", {
          class: "util",
          style: "left:" + Math.min(100, (100 * g.utilization_milli) / computeScale) + "%",
          title: "compute in use at the heartbeat",
        }),
      );
    }
    const parts = [
      "gpu" + g.index,
      g.model,
      "memory " + g.memory_held + (g.memory_mib ? " / " + g.memory_mib : "") + " MiB held",
      "compute " + g.compute_held + " / 1000 milli held",
    ];
    if (g.utilization_milli !== null && g.utilization_milli !== undefined) {
      parts.push("in use " + g.utilization_milli + " milli");
    }
    if (g.measured_pct !== null && g.measured_pct !== undefined) {
      parts.push("measured " + g.measured_pct + " %");
    } else if (mode === "operator") {
      parts.push("measured –");
    }
    if (g.queued) parts.push(g.queued + " queued");
    return el(
      "div",
      {
        class: "gpu",
        "data-node": node.name,
        "data-index": g.index,
        "data-model": g.model,
        "data-memory-mib": g.memory_mib,
        "data-memory-held-mib": g.memory_held,
        "data-compute-held-milli": g.compute_held,
        "data-utilization-milli": g.utilization_milli,
        "data-memory-used-mib": g.memory_used_mib,
        "data-measured-utilization-pct": g.measured_pct,
        "data-slices": g.slices.length,
      },
      el("div", { class: "label" }, parts.filter(Boolean).join(" · ")),
      mem,
      cmp,
    );
  }

  function drawPools(model) {
    const root = $("pools");
    root.replaceChildren(
      ...model.pools.map((p) =>
        el(
          "div",
          { class: "pool", "data-pool": p.name, "data-kind": p.kind },
          el("h3", {}, "pool " + p.name + (p.kind ? " (" + p.kind + ")" : "")),
          el(
            "div",
            { class: "nodes" },
            ...p.nodes.map((n) => {
              const link = n.link
                ? "agent linked to r" + n.link.replica +
                  (n.age !== null ? " · heartbeat " + fmt(n.age / 1000, 1) + " s ago" : " · no heartbeat yet") +
                  (n.link.in_flight !== null && n.link.in_flight !== undefined
                    ? " · " + n.link.in_flight + " in flight"
                    : "")
                : "no agent linked";
              return el(
                "div",
                {
                  class: "node",
                  "data-node": n.name,
                  "data-state": n.state,
                  "data-link-replica": n.link ? n.link.replica : "",
                  "data-gpus": n.gpus.length,
                },
                el("h4", {}, n.name + " · " + n.state),
                el("div", { class: "link" }, link),
                ...n.gpus.map((g) => drawGpu(n, g)),
              );
            }),
          ),
        ),
      ),
    );
  }

  function drawFunctions(model) {
    const rows = model.functions.map((f) => {
      const s = f.stats || { invocations: 0, within_deadline: 0, late: 0, failed: 0, p50_us: null, p99_us: null };
      const attain = pct(s.within_deadline, s.invocations);
      return el(
        "tr",
        {
          class: "function",
          "data-tenant": f.spec.tenant,
          "data-function": f.spec.name,
          "data-tier": f.spec.tier,
          "data-desired": f.spec.min_instances,
          "data-max": f.spec.max_instances,
          "data-current": f.current,
          "data-metered-invocations": f.metered,
          "data-invocations": s.invocations,
          "data-within": s.within_deadline,
          "data-late": s.late,
          "data-failed": s.failed,
          "data-p50-us": s.p50_us,
          "data-p99-us": s.p99_us,
        },
        el("td", {}, f.spec.tenant),
        el("td", {}, f.spec.name),
        el("td", {}, f.spec.tier),
        el("td", {}, typeof f.spec.pool === "string" ? f.spec.pool : JSON.stringify(f.spec.pool)),
        el("td", {}, f.spec.deadline_ms),
        el("td", {}, f.spec.min_instances + " (" + f.spec.min_instances + "–" + f.spec.max_instances + ")"),
        el("td", {}, f.current),
        el("td", {}, f.metered),
        el("td", {}, s.invocations),
        el("td", {}, attain === null ? "–" : fmt(attain, 1) + " %"),
        el("td", {}, s.late),
        el("td", {}, s.failed),
        el("td", {}, fmt(ms(s.p50_us), 1)),
        el("td", {}, fmt(ms(s.p99_us), 1)),
      );
    });
    $("functions").tBodies[0].replaceChildren(...rows);
  }

  function drawTenants(model) {
    const rows = model.tenants.map((t) =>
      el(
        "tr",
        {
          class: "tenant",
          "data-tenant": t.name,
          "data-total": t.total,
          "data-invocations": t.invocations,
          "data-compute-milli-gpu-ms": t.compute,
          "data-memory-mib-ms": t.memory,
        },
        el("td", {}, t.name),
        el("td", {}, t.invocations),
        el("td", {}, fmt(t.compute / 1e6, 2)),
        el("td", {}, fmt(t.memory / 1024 / 3.6e6, 4)),
        el("td", {}, t.total + " " + t.unit),
      ),
    );
    $("tenants").tBodies[0].replaceChildren(...rows);
  }

  function drawEvents(model) {
    $("events").replaceChildren(
      ...model.events.map((e) =>
        el(
          "li",
          { class: "event", "data-kind": e.kind, "data-instance": e.instance },
          new Date(e.at_ms).toISOString().slice(11, 23) + " ",
          el("span", { class: "kind" }, e.kind),
          " " + (e.tenant ? e.tenant + "/" + e.function : "?") + " #" + e.instance + " on " + e.node +
            (e.detail ? " " + e.detail : ""),
        ),
      ),
    );
  }

  function setStatus(text, error) {
    const s = $("status");
    s.textContent = text;
    s.dataset.polls = String(polls);
    s.dataset.mode = mode || "";
    s.dataset.error = error || "";
  }

  async function poll() {
    try {
      const cluster = await api("/v1/cluster");
      let m;
      if (mode !== "tenant") {
        try {
          m = await operatorModel(cluster);
          mode = "operator";
        } catch (e) {
          if (!(e instanceof ApiError && e.status === 403)) throw e;
          mode = "tenant";
        }
      }
      if (mode === "tenant") m = await tenantModel(cluster);
      const model = buildModel(m);
      polls += 1;
      $("who").textContent =
        mode === "operator" ? "operator" : "tenant " + (m.functions[0] ? m.functions[0].tenant : (m.bills[0] || {}).tenant || "");
      $("region").textContent =
        "replica r" + cluster.id + " (" + cluster.role + "), leader r" + (cluster.leader ?? "?") +
        ", applied " + (cluster.last_applied ?? "–");
      for (const id of ["pools-section", "functions-section", "tenants-section", "events-section"]) {
        $(id).hidden = false;
      }
      drawPools(model);
      drawFunctions(model);
      drawTenants(model);
      drawEvents(model);
      const failed = m.activity.replicas.filter((r) => !r.ok);
      setStatus(
        "updated " + new Date().toISOString().slice(11, 19) + " UTC · poll " + polls +
          (failed.length ? " · no answer from " + failed.map((r) => "r" + r.id).join(", ") : ""),
        "",
      );
    } catch (e) {
      setStatus("error: " + e.message, e.code || "error");
    }
  }

  if (!token) {
    $("no-token").hidden = false;
    setStatus("no token", "no_token");
    return;
  }
  let running = false;
  const tick = async () => {
    if (running) return;
    running = true;
    await poll();
    running = false;
  };
  tick();
  setInterval(tick, POLL_MS);
})();
