// The side panels: what is selected (a switch's ports and table, a link and its fault buttons), the route
// between two hosts, the engine and token controls.
import { api } from "./api.js";
import { percent } from "./colours.js";

function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.append(td);
}

function table(headers) {
  const t = document.createElement("table");
  const head = t.createTHead().insertRow();
  for (const h of headers) {
    const th = document.createElement("th");
    th.textContent = h;
    head.append(th);
  }
  t.createTBody();
  return t;
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) {
    n /= 1000;
    i += 1;
  }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export class Details {
  constructor(root, graph, say) {
    this.root = root;
    this.graph = graph;
    this.say = say;
    this.current = null;
  }

  clear(text) {
    this.root.replaceChildren();
    const p = document.createElement("p");
    p.className = "hint";
    p.textContent = text;
    this.root.append(p);
  }

  async showSwitch(name) {
    this.current = { kind: "switch", name };
    const [info, links] = await Promise.all([api.switchInfo(name), api.links()]);
    if (this.current.name !== name) return;
    this.root.replaceChildren();
    const h = document.createElement("h3");
    h.textContent = `${name} (${info.connected ? (info.in_sync ? "in sync" : "connected, updating") : "disconnected"})`;
    const p = document.createElement("p");
    p.textContent = `dpid ${info.dpid}; flows ${info.flows ?? "?"}/${info.desired_flows}, groups ${info.groups ?? "?"}/${info.desired_groups}`;
    const ports = table(["port", "peer", "state", "out", "in", "tx", "rx", "drops"]);
    ports.classList.add("ports");
    const rows = [];
    for (const link of links) {
      for (const [side, far, dir] of [["a", "b", 0], ["b", "a", 1]]) {
        if (!link[side].startsWith(`${name}:`)) continue;
        const port = Number(link[side].split(":").pop());
        const graphLink = this.graph.links[link.id];
        const util = this.graph.linkUtil(graphLink);
        const c = link[`${side}_counters`];
        rows.push([port, link[far], link.up ? "up" : "down", percent(util[dir]), percent(util[1 - dir]),
          c ? bytes(c.tx_bytes) : "–", c ? bytes(c.rx_bytes) : "–", c ? String(c.rx_dropped + c.tx_dropped) : "–"]);
      }
    }
    rows.sort((x, y) => x[0] - y[0]);
    for (const r of rows) {
      const row = ports.tBodies[0].insertRow();
      r.forEach((v, i) => cell(row, String(v), i === 2 ? `state-${v}` : undefined));
    }
    const lftButton = document.createElement("button");
    lftButton.textContent = "forwarding table";
    const lftBox = document.createElement("div");
    lftButton.addEventListener("click", async () => {
      try {
        const lft = await api.lft(name);
        const t = table(["LID", "port", "destination"]);
        t.classList.add("lft");
        for (const e of lft.entries) {
          const row = t.tBodies[0].insertRow();
          cell(row, String(e.lid));
          cell(row, String(e.port));
          cell(row, e.dest);
        }
        const caption = document.createElement("p");
        caption.textContent = `generation ${lft.generation}, ${lft.engine}, ${lft.entries.length} entries`;
        lftBox.replaceChildren(caption, t);
      } catch (error) {
        this.say(`forwarding table of ${name}: ${error.message}`, true);
      }
    });
    this.root.append(h, p, ports, lftButton, lftBox);
  }

  showLink(link) {
    this.current = { kind: "link", name: link.key };
    this.root.replaceChildren();
    const [ab, ba] = this.graph.linkUtil(link);
    const a = this.graph.nodes[link.a].name;
    const b = this.graph.nodes[link.b].name;
    const h = document.createElement("h3");
    h.textContent = link.key;
    const p = document.createElement("p");
    const down = this.graph.down.has(link.id);
    p.textContent = `${link.tier}, ${link.bw} Gb/s, ${down ? "FAILED" : "up"}; ${a}→${b} ${percent(ab)}, ${b}→${a} ${percent(ba)}`;
    const target = `${a}:${link.ap}`;
    const fail = document.createElement("button");
    fail.id = "fail-link";
    fail.textContent = "fail this link (emulator)";
    const restore = document.createElement("button");
    restore.id = "restore-link";
    restore.textContent = "restore it";
    for (const [button, action] of [[fail, "link_down"], [restore, "link_up"]]) {
      button.addEventListener("click", async () => {
        try {
          const done = await api.fault(action, target);
          this.say(`emulator: ${done.applied}`);
        } catch (error) {
          this.say(`emulator: ${error.message}`, true);
        }
      });
    }
    this.root.append(h, p, fail, restore);
  }

  showAggregate(edge) {
    this.current = { kind: "agg", name: edge.key };
    this.root.replaceChildren();
    const h = document.createElement("h3");
    h.textContent = `${edge.members.length} links: ${edge.key.replaceAll("g:", "").replaceAll("n:", "#")}`;
    const t = table(["link", "state", "a→b", "b→a"]);
    for (const link of edge.members) {
      const [ab, ba] = this.graph.linkUtil(link);
      const row = t.tBodies[0].insertRow();
      cell(row, link.key);
      cell(row, this.graph.down.has(link.id) ? "down" : "up");
      cell(row, percent(ab));
      cell(row, percent(ba));
    }
    this.root.append(h, t);
  }
}

export async function showRoute(graph, src, dst, out) {
  const route = await api.route(src, dst);
  const nodes = new Set(route.hops.map((h) => h.node));
  const links = new Set();
  for (const hop of route.hops) {
    if (hop.out_port === null || hop.out_port === undefined) continue;
    const link = graph.byPort.get(`${hop.node}:${hop.out_port}`);
    if (link) links.add(link.id);
  }
  graph.ensureVisible(nodes);
  graph.route = { nodes, links };
  graph.update();
  out.textContent = `generation ${route.generation}: ${route.path}`;
  return route;
}
