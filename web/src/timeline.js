// The event timeline: newest first, reroutes and failovers marked, a strip of the last minutes above it.
const MAX_ITEMS = 300;
const STRIP_S = 300;
const REROUTES = new Set(["port_down", "port_up", "routing_change"]);

function clock(at) {
  return new Date(at * 1000).toLocaleTimeString([], { hour12: false });
}

export function describe(event) {
  const ms = event.installed_ms !== undefined ? ` — new tables everywhere in ${event.installed_ms} ms` : "";
  const mods = event.flow_mods !== undefined ? `, ${event.flow_mods} flow-mods` : "";
  switch (event.kind) {
    case "port_down":
      return `reroute: ${(event.ports || []).join(", ")}${ms}${mods}`;
    case "port_up":
      return `reroute back: ${(event.ports || []).join(", ")}${ms}${mods}`;
    case "routing_change":
      return `routing changed to ${event.engine || "?"} (generation ${event.generation})${ms}${mods}`;
    case "routing_computed":
      return `routing computed: ${event.engine} generation ${event.generation}`;
    case "switch_connect":
      return `${event.switch} connected${event.ports_down && event.ports_down.length ? ` (ports down: ${event.ports_down.join(", ")})` : ""}${mods}`;
    case "switch_disconnect":
      return `${event.switch} disconnected`;
    case "switch_read_failed":
      return `reading ${event.switch} failed: ${event.reason}`;
    case "unknown_switch":
      return `unknown datapath ${event.dpid} connected (ignored)`;
    case "state_save_failed":
      return `state not saved: ${event.reason}`;
    default:
      return event.kind;
  }
}

export class Timeline {
  constructor(list, strip) {
    this.list = list;
    this.strip = strip;
    this.events = [];
  }

  add(events) {
    if (!events.length) return;
    const fragment = document.createDocumentFragment();
    for (const event of events) {
      const item = document.createElement("li");
      item.className = `event kind-${event.kind}${REROUTES.has(event.kind) ? " reroute" : ""}`;
      item.dataset.eventKind = event.kind;
      item.dataset.eventId = event.id;
      const time = document.createElement("time");
      time.textContent = clock(event.at);
      const text = document.createElement("span");
      text.textContent = describe(event);
      item.append(time, text);
      fragment.prepend(item);
      this.events.push(event);
    }
    this.list.prepend(fragment);
    while (this.list.childElementCount > MAX_ITEMS) this.list.lastElementChild.remove();
    if (this.events.length > MAX_ITEMS) this.events.splice(0, this.events.length - MAX_ITEMS);
  }

  gap() {
    const item = document.createElement("li");
    item.className = "event gap";
    item.textContent = "… older events were skipped (see GET /api/v1/events)";
    this.list.prepend(item);
  }

  drawStrip(now) {
    const svg = this.strip;
    const width = svg.clientWidth || 300;
    svg.setAttribute("viewBox", `0 0 ${width} 24`);
    svg.replaceChildren();
    for (const event of this.events) {
      const age = now - event.at;
      if (age > STRIP_S || age < -5) continue;
      const tick = document.createElementNS("http://www.w3.org/2000/svg", "rect");
      tick.setAttribute("x", (width * (1 - age / STRIP_S) - 1).toFixed(1));
      tick.setAttribute("y", "3");
      tick.setAttribute("width", "2");
      tick.setAttribute("height", "18");
      tick.setAttribute("class", `tick kind-${event.kind}`);
      svg.append(tick);
    }
  }
}
