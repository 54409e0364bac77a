// The fabric drawing: rows by tier (hosts at the bottom), positions from the server's layout, links coloured
// by live utilisation, failed links dashed with a cross; pods (or a leaf's hosts) can be collapsed into one
// box whose links are the aggregate of its members'. Every node element carries data-node, every link
// data-link="a:port-b:port"; collapsed boxes carry data-group and their links data-agg.
import { select } from "d3-selection";
import { zoom, zoomIdentity } from "d3-zoom";
import { utilColour } from "./colours.js";

const SVG_NS = "http://www.w3.org/2000/svg";
const MARGIN = 40;

export class FabricGraph {
  constructor(svgElement, view, handlers) {
    this.svg = select(svgElement);
    this.view = view;
    this.handlers = handlers;
    this.nodes = view.nodes.map((n, i) => ({ ...n, index: i }));
    this.links = view.links.map(([a, ap, b, bp, tier, bw], id) => ({
      id,
      a,
      b,
      ap,
      bp,
      tier: view.link_tiers[tier],
      bw,
      key: `${view.nodes[a].name}:${ap}-${view.nodes[b].name}:${bp}`,
    }));
    this.byPort = new Map();
    for (const link of this.links) {
      this.byPort.set(`${this.nodes[link.a].name}:${link.ap}`, link);
      this.byPort.set(`${this.nodes[link.b].name}:${link.bp}`, link);
    }
    this.groups = new Map(view.groups.map((g) => [g.name, g]));
    this.collapsed = new Set(view.collapsed ? view.groups.map((g) => g.name) : []);
    this.down = new Set();
    this.util = null;
    this.disconnected = new Set();
    this.route = { links: new Set(), nodes: new Set() };
    this.selected = null;
    this.top = Math.max(1, ...this.nodes.map((n) => n.level));
    const box = svgElement.getBoundingClientRect();
    this.aspect = box.width > 0 && box.height > 0 ? box.height / box.width : 0.6;
    this.viewport = this.svg.append("g").attr("class", "viewport");
    this.linkLayer = this.viewport.append("g").attr("class", "links");
    this.nodeLayer = this.viewport.append("g").attr("class", "nodes");
    this.zoom = zoom()
      .scaleExtent([0.2, 40])
      .on("zoom", (event) => this.viewport.attr("transform", event.transform));
    this.svg.call(this.zoom).on("dblclick.zoom", null);
    this.layout();
  }

  // Canvas size for what is visible: wide enough for the fullest row, as tall as the pane's shape allows.
  resize(visibleNodes) {
    const counts = {};
    for (const n of visibleNodes) counts[n.level] = (counts[n.level] || 0) + 1;
    const groupsShown = this.collapsed.size;
    const widest = Math.max(groupsShown * 4, ...Object.values(counts));
    this.width = Math.max(1000, Math.min(widest * 16, 9000));
    this.height = Math.max(MARGIN * 2 + this.top * 90, Math.min(this.width * this.aspect, MARGIN * 2 + this.top * 400));
    this.rowGap = (this.height - 2 * MARGIN) / this.top;
    this.svg.attr("viewBox", `0 0 ${this.width} ${this.height}`);
    return counts;
  }

  x(node) {
    return MARGIN + node.x * (this.width - 2 * MARGIN);
  }

  y(level) {
    return MARGIN + (this.top - level) * this.rowGap;
  }

  rep(index) {
    const group = this.nodes[index].group;
    return group && this.collapsed.has(group) ? `g:${group}` : `n:${index}`;
  }

  point(rep) {
    if (rep.startsWith("n:")) {
      const node = this.nodes[Number(rep.slice(2))];
      return [this.x(node), this.y(node.level)];
    }
    const g = this.groups.get(rep.slice(2));
    const x = MARGIN + ((g.x0 + g.x1) / 2) * (this.width - 2 * MARGIN);
    return [x, this.y(g.level_max) - 10];
  }

  // Rebuild the elements (start, collapse/expand): visible nodes, boxes and links.
  layout() {
    const visibleNodes = this.nodes.filter((n) => !(n.group && this.collapsed.has(n.group)));
    const counts = this.resize(visibleNodes);
    this.radius = {};
    for (const [level, count] of Object.entries(counts)) {
      this.radius[level] = Math.max(2.5, Math.min(9, ((this.width - 2 * MARGIN) / count) * 0.32));
    }
    const drawn = [];
    const aggregates = new Map();
    for (const link of this.links) {
      const ra = this.rep(link.a);
      const rb = this.rep(link.b);
      if (ra === rb) continue;
      if (ra.startsWith("n:") && rb.startsWith("n:")) {
        drawn.push({ kind: "link", link, ra, rb });
      } else {
        const key = ra < rb ? `${ra}|${rb}` : `${rb}|${ra}`;
        if (!aggregates.has(key)) aggregates.set(key, { kind: "agg", key, ra, rb, members: [] });
        aggregates.get(key).members.push(link);
      }
    }
    this.edges = drawn.concat([...aggregates.values()]);
    this.drawEdges();
    this.drawNodes(visibleNodes);
    this.update();
  }

  drawEdges() {
    const layer = this.linkLayer.node();
    layer.replaceChildren();
    this.edgeElements = [];
    for (const edge of this.edges) {
      const [x1, y1] = this.point(edge.ra);
      const [x2, y2] = this.point(edge.rb);
      const g = document.createElementNS(SVG_NS, "g");
      const line = document.createElementNS(SVG_NS, "line");
      for (const [k, v] of [["x1", x1], ["y1", y1], ["x2", x2], ["y2", y2]]) line.setAttribute(k, v.toFixed(1));
      const hit = line.cloneNode();
      hit.setAttribute("class", "hit");
      line.setAttribute("class", "wire");
      const cross = document.createElementNS(SVG_NS, "text");
      cross.setAttribute("class", "cross");
      cross.setAttribute("x", ((x1 + x2) / 2).toFixed(1));
      cross.setAttribute("y", ((y1 + y2) / 2 + 4).toFixed(1));
      cross.textContent = "✕";
      const title = document.createElementNS(SVG_NS, "title");
      g.append(line, hit, cross, title);
      if (edge.kind === "link") {
        g.setAttribute("class", `link tier-${edge.link.tier}`);
        g.dataset.link = edge.link.key;
        g.dataset.id = edge.link.id;
      } else {
        g.setAttribute("class", "link aggregate");
        g.dataset.agg = edge.key;
      }
      g.addEventListener("click", (event) => {
        event.stopPropagation();
        this.handlers.onEdge(edge);
      });
      layer.append(g);
      this.edgeElements.push([edge, g, line, title]);
    }
  }

  drawNodes(visibleNodes) {
    const layer = this.nodeLayer.node();
    layer.replaceChildren();
    this.nodeElements = new Map();
    const labelled = {};
    for (const [level, r] of Object.entries(this.radius)) labelled[level] = r >= 6;
    for (const node of visibleNodes) {
      const g = document.createElementNS(SVG_NS, "g");
      g.setAttribute("class", `node ${node.kind} level-${node.level}`);
      g.setAttribute("transform", `translate(${this.x(node).toFixed(1)},${this.y(node.level).toFixed(1)})`);
      g.dataset.node = node.name;
      g.dataset.tier = this.view.levels[node.level];
      const r = this.radius[node.level];
      const shape = document.createElementNS(SVG_NS, node.kind === "switch" ? "rect" : "circle");
      if (node.kind === "switch") {
        for (const [k, v] of [["x", -r * 1.3], ["y", -r * 0.8], ["width", r * 2.6], ["height", r * 1.6], ["rx", 2]]) {
          shape.setAttribute(k, v.toFixed(1));
        }
      } else {
        shape.setAttribute("r", (r * 0.8).toFixed(1));
      }
      const title = document.createElementNS(SVG_NS, "title");
      title.textContent = `${node.name} (${this.view.levels[node.level]})`;
      g.append(shape, title);
      if (labelled[node.level]) {
        const text = document.createElementNS(SVG_NS, "text");
        text.setAttribute("y", node.kind === "switch" ? -r - 3 : r + 10);
        text.textContent = node.name;
        g.append(text);
      }
      g.addEventListener("click", (event) => {
        event.stopPropagation();
        this.handlers.onNode(node);
      });
      layer.append(g);
      this.nodeElements.set(node.name, g);
    }
    for (const name of this.collapsed) {
      const group = this.groups.get(name);
      if (!group) continue;
      const x0 = MARGIN + group.x0 * (this.width - 2 * MARGIN) - 6;
      const x1 = MARGIN + group.x1 * (this.width - 2 * MARGIN) + 6;
      const y0 = this.y(group.level_max) - 10;
      const y1 = this.y(group.level_min) + 10;
      const g = document.createElementNS(SVG_NS, "g");
      g.setAttribute("class", "group");
      g.dataset.group = name;
      const rect = document.createElementNS(SVG_NS, "rect");
      for (const [k, v] of [["x", x0], ["y", y0], ["width", x1 - x0], ["height", y1 - y0], ["rx", 8]]) {
        rect.setAttribute(k, v.toFixed(1));
      }
      const text = document.createElementNS(SVG_NS, "text");
      text.setAttribute("x", ((x0 + x1) / 2).toFixed(1));
      text.setAttribute("y", ((y0 + y1) / 2).toFixed(1));
      text.textContent = name;
      const title = document.createElementNS(SVG_NS, "title");
      title.textContent = `${group.label} (click to expand)`;
      g.append(rect, text, title);
      g.addEventListener("click", (event) => {
        event.stopPropagation();
        this.expand(name);
      });
      layer.prepend(g);
    }
  }

  expand(name) {
    this.collapsed.delete(name);
    this.layout();
  }

  setCollapsed(all) {
    this.collapsed = new Set(all ? this.groups.keys() : []);
    this.layout();
  }

  ensureVisible(nodeNames) {
    let changed = false;
    for (const name of nodeNames) {
      const node = this.nodes.find((n) => n.name === name);
      if (node && node.group && this.collapsed.has(node.group)) {
        this.collapsed.delete(node.group);
        changed = true;
      }
    }
    if (changed) this.layout();
  }

  linkUtil(link) {
    if (!this.util) return [null, null];
    const ab = this.util[2 * link.id];
    const ba = this.util[2 * link.id + 1];
    return [ab < 0 ? null : ab / 1000, ba < 0 ? null : ba / 1000];
  }

  // Apply the latest state (colours, failed marks, route, selection) to the existing elements.
  update() {
    for (const [edge, g, line, title] of this.edgeElements) {
      const members = edge.kind === "link" ? [edge.link] : edge.members;
      let worst = null;
      let down = 0;
      let onRoute = false;
      for (const link of members) {
        const [ab, ba] = this.linkUtil(link);
        for (const v of [ab, ba]) if (v !== null && (worst === null || v > worst)) worst = v;
        if (this.down.has(link.id)) down += 1;
        if (this.route.links.has(link.id)) onRoute = true;
      }
      const failed = down > 0 && down === members.length;
      const state = failed ? "down" : down > 0 ? "degraded" : "up";
      if (g.dataset.state !== state) g.dataset.state = state;
      g.classList.toggle("failed", failed);
      g.classList.toggle("degraded", down > 0 && !failed);
      g.classList.toggle("route", onRoute);
      g.classList.toggle("selected", this.selected === edge.key || (edge.link && this.selected === edge.link.key));
      line.setAttribute("stroke", failed ? "#c0392b" : utilColour(worst));
      const pct = worst === null ? "no counters yet" : `${(worst * 100).toFixed(1)} % (busiest direction)`;
      const what = edge.kind === "link" ? edge.link.key : `${edge.key.replaceAll("g:", "").replaceAll("n:", "#")} (${members.length} links)`;
      title.textContent = `${what}: ${state}, ${pct}`;
    }
    for (const [name, g] of this.nodeElements) {
      g.classList.toggle("disconnected", this.disconnected.has(name));
      g.classList.toggle("route", this.route.nodes.has(name));
      g.classList.toggle("selected", this.selected === name);
    }
  }

  fit() {
    this.svg.call(this.zoom.transform, zoomIdentity);
  }
}
