// Talking to the controller (same origin) and the emulator (its own port; CORS allows this page's origin).
// Mutations send the bearer token when one is set; the token stays in this tab's sessionStorage.

const store = window.sessionStorage;

export function token() {
  return store.getItem("fabriclab.token") || "";
}

export function setToken(value) {
  if (value) store.setItem("fabriclab.token", value);
  else store.removeItem("fabriclab.token");
}

export function emulatorUrl() {
  const given = new URLSearchParams(location.search).get("emu") || store.getItem("fabriclab.emu");
  return (given || `${location.protocol}//${location.hostname}:8081`).replace(/\/+$/, "");
}

export function setEmulatorUrl(value) {
  if (value) store.setItem("fabriclab.emu", value);
}

async function call(url, options = {}) {
  const headers = { Accept: "application/json", ...(options.headers || {}) };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  if (options.mutation && token()) headers.Authorization = `Bearer ${token()}`;
  const response = await fetch(url, {
    method: options.method || "GET",
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
  });
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { error: text.slice(0, 200) };
  }
  if (!response.ok) {
    const why = (data && data.error) || response.statusText;
    throw new Error(`${response.status}: ${why}`);
  }
  return data;
}

export const api = {
  view: () => call("/api/v1/view"),
  route: (src, dst) => call(`/api/v1/routes?src=${encodeURIComponent(src)}&dst=${encodeURIComponent(dst)}`),
  switchInfo: (name) => call(`/api/v1/switches/${encodeURIComponent(name)}`),
  lft: (name) => call(`/api/v1/switches/${encodeURIComponent(name)}/lft`),
  links: () => call("/api/v1/links?counters=true"),
  setEngine: (engine) => call("/api/v1/routing", { method: "PUT", body: { engine }, mutation: true }),
  fault: (action, target) =>
    call(`${emulatorUrl()}/api/v1/faults`, { method: "POST", body: { action, target }, mutation: true }),
};
