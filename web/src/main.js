// The live fabric view: draws /api/v1/view once, then applies the frames the controller pushes over
// server-sent events (/api/v1/view/stream, a few per second at most), batching DOM work per animation frame.
import { api, emulatorUrl, setEmulatorUrl, setToken, token } from "./api.js";
import { FabricGraph } from "./graph.js";
import { Details, showRoute } from "./panels.js";
import { Timeline } from "./timeline.js";

const $ = (id) => document.getElementById(id);
const stats = { renderMs: null, frames: 0, bytes: 0, lastApplyMs: null, firstFrameAt: null };
window.fabriclabStats = stats;

function say(text, bad = false) {
  const box = $("message");
  box.textContent = text;
  box.classList.toggle("bad", bad);
}

function fillSelect(select, values, chosen) {
  select.replaceChildren(
    ...values.map((v) => {
      const option = document.createElement("option");
      option.value = v;
      option.textContent = v;
      option.selected = v === chosen;
      return option;
    }),
  );
}

async function boot() {
  const t0 = performance.now();
  let view;
  try {
    view = await api.view();
  } catch (error) {
    say(`cannot load the fabric: ${error.message}`, true);
    return;
  }
  $("fabric-name").textContent = view.summary;
  document.title = `fabriclab — ${view.fabric}`;
  const timeline = new Timeline($("events"), $("timeline-strip"));
  let details = null;
  const graph = new FabricGraph($("fabric"), view, {
    onNode: (node) => {
      graph.selected = node.name;
      graph.update();
      if (node.kind === "switch") details.showSwitch(node.name).catch((e) => say(e.message, true));
      else details.clear(`${node.name}: a host (pick it in Route to see its path)`);
    },
    onEdge: (edge) => {
      graph.selected = edge.kind === "link" ? edge.link.key : edge.key;
      graph.update();
      if (edge.kind === "link") details.showLink(edge.link);
      else details.showAggregate(edge);
    },
  });
  details = new Details($("details-body"), graph, say);
  stats.renderMs = performance.now() - t0;
  document.body.dataset.drawn = String(view.nodes.length);

  const hosts = view.nodes.filter((n) => n.kind === "host").map((n) => n.name);
  fillSelect($("src"), hosts, hosts[0]);
  fillSelect($("dst"), hosts, hosts[hosts.length - 1]);
  fillSelect($("engine"), view.engines, view.engine);
  $("show-route").addEventListener("click", () =>
    showRoute(graph, $("src").value, $("dst").value, $("route-text")).catch((e) => say(`route: ${e.message}`, true)),
  );
  $("clear-route").addEventListener("click", () => {
    graph.route = { nodes: new Set(), links: new Set() };
    $("route-text").textContent = "";
    graph.update();
  });
  $("apply-engine").addEventListener("click", async () => {
    try {
      const event = await api.setEngine($("engine").value);
      say(`routing: ${event.engine || $("engine").value}, generation ${event.generation}`);
    } catch (error) {
      say(`routing: ${error.message}`, true);
    }
  });
  $("token").value = token();
  $("token").addEventListener("change", () => setToken($("token").value.trim()));
  $("token-row").hidden = !view.token_required && !token();
  $("emu-url").value = emulatorUrl();
  $("emu-url").addEventListener("change", () => setEmulatorUrl($("emu-url").value.trim()));
  $("collapse").textContent = graph.collapsed.size ? "expand all" : "collapse groups";
  $("collapse").hidden = view.groups.length === 0;
  $("collapse").addEventListener("click", () => {
    graph.setCollapsed(graph.collapsed.size === 0);
    $("collapse").textContent = graph.collapsed.size ? "expand all" : "collapse groups";
  });
  $("fit").addEventListener("click", () => graph.fit());
  $("fabric").addEventListener("click", () => {
    graph.selected = null;
    graph.update();
  });

  let pending = null;
  let lastEvent = 0;
  function apply() {
    const frame = pending;
    pending = null;
    const start = performance.now();
    graph.down = new Set(frame.down);
    graph.disconnected = new Set(frame.disconnected);
    if (frame.util) graph.util = frame.util;
    graph.update();
    if (frame.events.length) timeline.add(frame.events);
    timeline.drawStrip(frame.at);
    const status = $("status");
    const state = frame.connected < frame.switches ? "partial" : frame.in_sync ? "ok" : "updating";
    status.dataset.state = state;
    status.textContent = `${frame.engine} · generation ${frame.generation} · ${frame.connected}/${frame.switches} switches${frame.in_sync ? " in sync" : ""} · ${frame.down.length} link(s) down`;
    if (document.activeElement !== $("engine")) $("engine").value = frame.engine;
    stats.lastApplyMs = performance.now() - start;
    document.body.dataset.live = "yes";
    document.body.dataset.generation = String(frame.generation);
  }

  function connect() {
    const source = new EventSource(`/api/v1/view/stream?since=${lastEvent}`);
    source.addEventListener("frame", (message) => {
      stats.frames += 1;
      stats.bytes += message.data.length;
      if (stats.firstFrameAt === null) stats.firstFrameAt = performance.now() - t0;
      const frame = JSON.parse(message.data);
      if (frame.events_gap) timeline.gap();
      if (frame.events.length) lastEvent = frame.events[frame.events.length - 1].id;
      if (pending) {
        // not drawn yet: keep the newest state, and every event
        frame.events = pending.events.concat(frame.events);
        if (!frame.util && pending.util) frame.util = pending.util;
        pending = frame;
      } else {
        pending = frame;
        requestAnimationFrame(apply);
      }
    });
    source.addEventListener("busy", () => {
      source.close();
      say("the controller has too many live viewers; retrying in 5 s", true);
      setTimeout(connect, 5000);
    });
    source.onerror = () => {
      $("status").dataset.state = "lost";
      $("status").textContent = "connection to the controller lost; reconnecting…";
    };
  }
  connect();
}

boot();
