// The live events page of eventspark: polls the events cache and shows what became of each event.
//
// Event contents come from the internet: everything is rendered with textContent and DOM nodes,
// never as HTML. The admin token is kept in sessionStorage (this tab only) and sent in the
// X-Admin-Token header; a `?token=` in the URL is taken once and removed from the address bar.
"use strict";

(function () {
  const TOKEN_KEY = "eventspark.admin_token";
  const STATUSES = ["pending", "success", "failed", "skipped"];
  const REQUEST_TIMEOUT_MS = 10000;
  const MAX_BACKOFF_MS = 10000;

  const state = {
    token: null,
    pollMs: 1000,
    backoffMs: 0,
    paused: false,
    timer: null,
    generation: 0, // bumped on every (re)start, so that an answer to an old request is dropped
    lastBody: null,
    expanded: new Set(),
    rows: new Map(), // event key -> {signature, row, detail}
    config: null,
  };

  const $ = (id) => document.getElementById(id);

  // --- DOM helpers: text only -------------------------------------------------------------------

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    if (props) {
      for (const [name, value] of Object.entries(props)) {
        if (name === "class") node.className = value;
        else if (name === "text") node.textContent = value;
        else node.setAttribute(name, value);
      }
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  function asText(value) {
    if (value === null || value === undefined) return "";
    if (typeof value === "object") return JSON.stringify(value);
    return String(value);
  }

  function showMessage(text) {
    const box = $("message");
    box.textContent = text;
    box.hidden = !text;
  }

  function setState(text, isError) {
    const node = $("state");
    node.textContent = text;
    node.classList.toggle("error", Boolean(isError));
  }

  // --- the admin token --------------------------------------------------------------------------

  function takeToken() {
    const url = new URL(window.location.href);
    const fromUrl = url.searchParams.get("token");
    if (fromUrl) {
      sessionStorage.setItem(TOKEN_KEY, fromUrl);
      url.searchParams.delete("token");
      window.history.replaceState(null, "", url.pathname + url.search + url.hash);
      return fromUrl;
    }
    return sessionStorage.getItem(TOKEN_KEY);
  }

  function askForToken(reason) {
    stopPolling();
    sessionStorage.removeItem(TOKEN_KEY);
    state.token = null;
    $("main").hidden = true;
    $("login").hidden = false;
    setState(reason ? "not signed in" : "", Boolean(reason));
    showMessage(reason || "");
    $("token-input").focus();
  }

  // --- HTTP ---------------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function getJson(path) {
    const abort = new AbortController();
    const timeout = setTimeout(() => abort.abort(), REQUEST_TIMEOUT_MS);
    let response;
    try {
      response = await fetch(path, {
        headers: { "X-Admin-Token": state.token, Accept: "application/json" },
        cache: "no-store",
        credentials: "omit",
        signal: abort.signal,
      });
    } catch (error) {
      throw new ApiError(0, "The server did not answer: " + (error && error.message ? error.message : error));
    } finally {
      clearTimeout(timeout);
    }
    const text = await response.text();
    if (!response.ok) throw new ApiError(response.status, errorText(response, text));
    try {
      return { text, data: JSON.parse(text) };
    } catch (error) {
      throw new ApiError(response.status, "The server's answer is not JSON: " + error.message);
    }
  }

  function errorText(response, text) {
    let message = "";
    try {
      const body = JSON.parse(text);
      message = [body.message, body.error].filter(Boolean).map(String).join(": ");
    } catch (ignored) {
      message = text.slice(0, 500);
    }
    return response.status + " " + (message || response.statusText);
  }

  // --- filters --------------------------------------------------------------------------------------

  function fillSelect(select, values) {
    const chosen = select.value;
    const known = new Set(Array.from(select.options, (option) => option.value));
    for (const value of values) {
      if (known.has(value)) continue;
      known.add(value);
      select.append(el("option", { value: value, text: value }));
    }
    select.value = chosen;
  }

  function cacheUrl() {
    const params = new URLSearchParams();
    const destination = $("filter-destination").value;
    const token = $("filter-token").value;
    if (destination) params.set("destination_ids", destination);
    if (token) params.set("token_ids", token);
    params.set("limit", $("filter-limit").value);
    return "/api/v1/events/cache?" + params.toString();
  }

  function visible(event) {
    const destination = $("filter-destination").value;
    const token = $("filter-token").value;
    const status = $("filter-status").value;
    return (
      (!destination || event.destination_id === destination) &&
      (!token || event.token_id === token) &&
      (!status || event.status === status)
    );
  }

  // --- rendering --------------------------------------------------------------------------------------

  function eventKey(event, index) {
    const id = event.event_id ? String(event.event_id) : "#" + index + "@" + asText(event.timestamp);
    return asText(event.destination_id) + "\u0000" + id;
  }

  function statusClass(status) {
    return "status status-" + (STATUSES.includes(status) ? status : "unknown");
  }

  function shortTime(timestamp) {
    const text = asText(timestamp);
    const match = /^(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d(\.\d{1,3})?)/.exec(text);
    return match ? match[1] + " " + match[2] : text;
  }

  function summaryText(event) {
    if (event.error) return asText(event.error);
    if (event.success && event.success.table) {
      const fields = Array.isArray(event.success.record) ? event.success.record.length : 0;
      return asText(event.success.table) + " (" + fields + " columns)";
    }
    return event.status === "pending" ? "waiting for the next load" : "";
  }

  function eventRow(event, key) {
    const toggle = el("button", { type: "button", class: "toggle", "aria-expanded": "false", text: "▸" });
    toggle.setAttribute("aria-label", "show details");
    const row = el(
      "tr",
      { class: "event" },
      el("td", null, toggle),
      el("td", { class: "time", title: asText(event.timestamp), text: shortTime(event.timestamp) }),
      el("td", { class: "token", text: asText(event.token_id) }),
      el("td", { class: "destination", text: asText(event.destination_id) }),
      el("td", { class: statusClass(event.status), text: asText(event.status) }),
      el("td", { class: "summary", title: summaryText(event), text: summaryText(event) }),
    );
    // Attribute values are text, never parsed as HTML: they let tests and scripts find an event.
    row.dataset.eventId = asText(event.event_id);
    row.dataset.destination = asText(event.destination_id);
    row.dataset.status = asText(event.status);
    row.addEventListener("click", () => toggleDetail(key));
    return row;
  }

  function detailRow(event) {
    const cell = el("td", { colspan: "6" });
    cell.append(el("p", { class: "event-id" }, "Event ", el("code", { text: asText(event.event_id) })));
    cell.append(el("section", { class: "original" }, el("h3", { text: "Original event" }), jsonBlock(event.original)));
    cell.append(storedSection(event));
    if (event.error) {
      cell.append(el("section", { class: "error" }, el("h3", { text: "Error" }), el("pre", { text: asText(event.error) })));
    }
    return el("tr", { class: "detail" }, cell);
  }

  function jsonBlock(value) {
    let text;
    try {
      text = JSON.stringify(value === undefined ? null : value, null, 2);
    } catch (error) {
      text = String(value);
    }
    return el("pre", { text: text });
  }

  function storedSection(event) {
    const section = el("section", { class: "stored" }, el("h3", { text: "Stored" }));
    const success = event.success;
    if (!success) {
      section.append(el("p", { text: event.status === "pending" ? "Not loaded yet." : "Nothing was stored." }));
      return section;
    }
    section.append(el("p", null, "Table ", el("code", { class: "table-name", text: asText(success.table) })));
    const body = el("tbody");
    for (const column of Array.isArray(success.record) ? success.record : []) {
      body.append(
        el(
          "tr",
          null,
          el("td", { class: "field", text: asText(column && column.field) }),
          el("td", { class: "type", text: asText(column && column.type) }),
          el("td", { class: "value", text: asText(column && column.value) }),
        ),
      );
    }
    const head = el("thead", null, el("tr", null, el("th", { text: "field" }), el("th", { text: "type" }), el("th", { text: "value" })));
    section.append(el("table", { class: "fields" }, head, body));
    return section;
  }

  function toggleDetail(key) {
    if (state.expanded.has(key)) state.expanded.delete(key);
    else state.expanded.add(key);
    const entry = state.rows.get(key);
    if (entry) placeDetail(key, entry);
  }

  function placeDetail(key, entry) {
    const open = state.expanded.has(key);
    const toggle = entry.row.querySelector("button.toggle");
    toggle.textContent = open ? "▾" : "▸";
    toggle.setAttribute("aria-expanded", String(open));
    entry.row.classList.toggle("open", open);
    if (open && !entry.detail) {
      entry.detail = detailRow(entry.event);
      entry.row.after(entry.detail);
    } else if (!open && entry.detail) {
      entry.detail.remove();
      entry.detail = null;
    }
  }

  function render(answer) {
    const events = Array.isArray(answer.events) ? answer.events : [];
    const shown = events.filter(visible);
    const nodes = [];
    const seen = new Map();
    shown.forEach((event, index) => {
      const key = eventKey(event, index);
      const signature = JSON.stringify(event);
      let entry = state.rows.get(key);
      if (!entry || entry.signature !== signature) {
        entry = { signature, event, row: eventRow(event, key), detail: null };
        if (state.expanded.has(key)) entry.detail = detailRow(event);
        if (state.expanded.has(key)) markOpen(entry.row);
      }
      seen.set(key, entry);
      nodes.push(entry.row);
      if (entry.detail) nodes.push(entry.detail);
    });
    state.rows = seen;
    $("event-rows").replaceChildren(...nodes);
    $("empty").hidden = shown.length > 0;
    $("counts").textContent =
      "Showing " + shown.length + " of " + asText(answer.response_events) + " returned, " +
      asText(answer.total_events) + " in the cache.";
    renderSummary(events);
  }

  function markOpen(row) {
    const toggle = row.querySelector("button.toggle");
    toggle.textContent = "▾";
    toggle.setAttribute("aria-expanded", "true");
    row.classList.add("open");
  }

  function renderSummary(events) {
    const counts = new Map();
    const destinations = state.config ? state.config.destinations : [];
    for (const destination of destinations) counts.set(destination.id, { info: destination, statuses: {} });
    for (const event of events) {
      const id = asText(event.destination_id);
      if (!counts.has(id)) counts.set(id, { info: null, statuses: {} });
      const statuses = counts.get(id).statuses;
      statuses[event.status] = (statuses[event.status] || 0) + 1;
    }
    const cards = [];
    for (const [id, { info, statuses }] of counts) {
      const card = el("div", { class: "card" }, el("strong", { text: id }));
      if (info) card.append(el("small", { text: info.type + ", " + info.mode }));
      for (const status of STATUSES) {
        if (statuses[status]) card.append(el("span", { class: statusClass(status), text: statuses[status] + " " + status }));
      }
      cards.push(card);
    }
    $("summary").replaceChildren(...cards);
  }

  // --- polling ------------------------------------------------------------------------------------------

  function stopPolling() {
    state.generation += 1;
    clearTimeout(state.timer);
    state.timer = null;
  }

  function restart() {
    stopPolling();
    state.lastBody = null;
    if (!state.paused) poll(state.generation);
  }

  function schedule(generation) {
    if (generation !== state.generation || state.paused) return;
    state.timer = setTimeout(() => poll(generation), state.pollMs + state.backoffMs);
  }

  async function poll(generation) {
    if (document.hidden) {
      // Nothing to show in a hidden tab: wait for it to become visible again.
      document.addEventListener("visibilitychange", () => generation === state.generation && poll(generation), { once: true });
      return;
    }
    try {
      const { text, data } = await getJson(cacheUrl());
      if (generation !== state.generation) return;
      state.backoffMs = 0;
      showMessage("");
      setState("live · updated " + new Date().toLocaleTimeString());
      if (text !== state.lastBody) {
        state.lastBody = text;
        render(data);
      }
    } catch (error) {
      if (generation !== state.generation) return;
      if (error.status === 401) {
        askForToken(error.message);
        return;
      }
      state.backoffMs = Math.min(MAX_BACKOFF_MS, state.backoffMs ? state.backoffMs * 2 : 1000);
      setState("retrying in " + Math.round((state.pollMs + state.backoffMs) / 1000) + " s", true);
      showMessage("Cannot read the events cache: " + error.message);
    }
    schedule(generation);
  }

  // --- start --------------------------------------------------------------------------------------------

  async function open() {
    setState("connecting…");
    try {
      const { data } = await getJson("/api/v1/ui/config");
      state.config = data;
    } catch (error) {
      if (error.status === 401) {
        askForToken(error.message);
        return;
      }
      state.config = null;
      showMessage("Cannot read the destinations: " + error.message);
    }
    if (state.config) {
      $("server-name").textContent = asText(state.config.server_name);
      const interval = Number(state.config.poll_interval_ms);
      if (interval >= 200 && interval <= 60000) state.pollMs = interval;
      fillSelect($("filter-destination"), state.config.destinations.map((d) => asText(d.id)));
      fillSelect($("filter-token"), state.config.tokens.map(asText));
    }
    $("login").hidden = true;
    $("main").hidden = false;
    restart();
  }

  function wire() {
    $("login").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = $("token-input").value.trim();
      if (!token) return;
      sessionStorage.setItem(TOKEN_KEY, token);
      state.token = token;
      $("token-input").value = "";
      showMessage("");
      open();
    });
    for (const id of ["filter-destination", "filter-token", "filter-limit"]) $(id).addEventListener("change", restart);
    $("filter-status").addEventListener("change", () => {
      state.lastBody = null; // the same answer, filtered differently
      state.rows = new Map();
      restart();
    });
    $("pause").addEventListener("click", () => {
      state.paused = !state.paused;
      $("pause").textContent = state.paused ? "Resume" : "Pause";
      if (state.paused) {
        stopPolling();
        setState("paused");
      } else {
        restart();
      }
    });
    $("forget").addEventListener("click", () => askForToken(""));
  }

  function start() {
    wire();
    state.token = takeToken();
    if (state.token) open();
    else askForToken("");
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
