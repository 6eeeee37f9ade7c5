// The idemgate operator console. Plain JavaScript, no dependencies: it calls
// the admin API with the token the operator typed (kept in this tab's
// session storage, sent as `Authorization: Bearer`, never a cookie) and
// renders every value from the API as text (textContent, never markup):
// keys, routes and evidence come from clients and upstreams.
"use strict";

(function () {
  const TOKEN_KEY = "idemgate.admin_token";
  const PAGE = 20;
  // Held work is read whole (oldest first), in pages of the API's maximum.
  const HELD_PAGE = 500;
  const HELD_PAGES = 20;
  const REFRESH_MS = 5000;
  const STATES = ["in_progress", "unknown", "not_attempted", "completed"];
  // Each table's columns, in order: its head and its rows' cell labels.
  const OPERATION_COLUMNS = ["Key", "Route", "State", "Age", "Evidence", "Next action"];
  const ROUTE_COLUMNS = ["Route", "Path prefix", "Pause", "Why", ...STATES];

  const $ = (id) => document.getElementById(id);
  const views = ["sign-in", "list", "operation", "routes"];

  // ---------------------------------------------------------------- DOM

  // An element with attributes and children; strings become text nodes.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "text") node.textContent = value;
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child === undefined || child === null) continue;
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  function show(element, text) {
    element.textContent = text;
    element.hidden = !text;
  }

  function showView(name, focus) {
    for (const view of views) $("view-" + view).hidden = view !== name;
    $("nav").hidden = name === "sign-in";
    for (const link of ["held", "routes"]) {
      const current = (name === "list" || name === "operation") ? "held" : name;
      if (link === current) $("nav-" + link).setAttribute("aria-current", "page");
      else $("nav-" + link).removeAttribute("aria-current");
    }
    // Focus where the keyboard is needed next: the token field, or the
    // view's heading so Tab continues from the top of what changed.
    if (focus) {
      const target = name === "sign-in" ? $("token") : $("view-" + name).querySelector("h1");
      if (target) target.focus();
    }
  }

  // `text` ending as a sentence does.
  function sentence(text) {
    return /[.!?]$/.test(text) ? text : text + ".";
  }

  function notice(text) {
    show($("notice"), text);
  }

  // ---------------------------------------------------------------- API

  class ApiError extends Error {
    constructor(status, problem, retryAfter) {
      super((problem && (problem.detail || problem.title)) || "HTTP " + status);
      this.status = status;
      this.problem = problem || {};
      // Seconds, from `Retry-After` (attempt-may-still-land), or null.
      this.retryAfter = retryAfter === undefined ? null : retryAfter;
    }
    // The problem's short name: `urn:idemgate:problem:<name>`.
    get kind() {
      const type = String(this.problem.type || "");
      return type.startsWith("urn:idemgate:problem:") ? type.slice(21) : "";
    }
  }

  // One path segment, so `.` and `..` stay names and never dot-segments.
  function segment(text) {
    return encodeURIComponent(text).replace(/\./g, "%2E");
  }

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  }

  // JSON typed by the operator, sent as typed: parsed and written again
  // here, its numbers would become doubles (an id past 2^53 changed).
  class RawJson {
    constructor(text) {
      this.text = text;
    }
  }

  // JSON.stringify, each RawJson written as its text.
  function serialize(value) {
    const raws = [];
    const text = JSON.stringify(value, (_, v) => {
      if (!(v instanceof RawJson)) return v;
      raws.push(v.text);
      return "\u0000raw" + (raws.length - 1);
    });
    return text.replace(/"\\u0000raw(\d+)"/g, (_, i) => raws[Number(i)]);
  }

  async function api(method, path, body) {
    const sent = token();
    const headers = { Accept: "application/json", Authorization: "Bearer " + sent };
    const init = { method, headers, cache: "no-store", credentials: "omit" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = serialize(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (error) {
      throw new ApiError(0, {
        title: "No answer",
        detail: "the admin listener did not answer (" + error.message + ")",
      });
    }
    const text = await response.text();
    // Signed out while it was on its way: its answer is not shown (a
    // refused token's error, which nothing shows).
    if (token() !== sent) {
      throw new ApiError(401, { title: "Signed out", detail: "signed out before the answer came" });
    }
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch (_) {
      data = { detail: text };
    }
    if (!response.ok) {
      const wait = Number.parseInt(response.headers.get("Retry-After") || "", 10);
      const error = new ApiError(response.status, data, Number.isNaN(wait) ? null : wait);
      // A refused token (or none configured) ends the session, whatever
      // the call: the sign-in form says why.
      if (response.status === 401) signedOut(error);
      throw error;
    }
    return data;
  }

  // What a refused token means, in words.
  function signInProblem(error) {
    if (error.kind === "admin-token-unset") {
      return "idemgate has no admin token configured, so nobody can sign in: " +
        error.message + ". (The variable is the one named by server.admin_token_env; " +
        "IDEMGATE_ADMIN_TOKEN by default.)";
    }
    if (error.status === 401) {
      return "Wrong token: the gateway refused it. Check the value of its admin token variable.";
    }
    return "Could not sign in: " + error.message;
  }

  // ---------------------------------------------------------------- sign-in

  function signedOut(error) {
    sessionStorage.removeItem(TOKEN_KEY);
    stopRefresh();
    forget();
    showView("sign-in", true);
    show($("sign-in-error"), error ? signInProblem(error) : "");
    $("token").focus();
  }

  async function signIn(event) {
    event.preventDefault();
    const typed = $("token").value.trim();
    if (!typed) {
      show($("sign-in-error"), "Type the admin token first.");
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, typed);
    try {
      await api("GET", "/admin/stats");
    } catch (error) {
      // On a 401, api() has already signed out and said why.
      sessionStorage.removeItem(TOKEN_KEY);
      show($("sign-in-error"), signInProblem(error));
      $("token").select();
      return;
    }
    $("token").value = "";
    show($("sign-in-error"), "");
    notice("");
    if (!location.hash || location.hash === "#/") location.hash = "#/held";
    else route();
  }

  // Takes out of the page everything the API said and everything typed
  // about it: a hidden view still holds its content, for anyone at this
  // screen after the token is gone.
  function forget() {
    const dialog = $("confirm");
    if (dialog.open) dialog.close();
    current = null;
    formFor = null;
    Object.assign(list, emptyList());
    for (const table of ["operations", "routes"]) $(table).tBodies[0].replaceChildren();
    for (const holder of ["operation-facts", "timeline", "pause-route"]) $(holder).replaceChildren();
    $("operation-title").textContent = "Operation";
    $("settle").hidden = true;
    resetSettleForm();
    for (const field of ["settle-operator", "filter-route", "filter-key", "pause-reason"]) {
      $(field).value = "";
    }
    for (const text of ["list-summary", "routes-summary"]) $(text).textContent = "";
    for (const text of ["settle-result", "pause-result"]) show($(text), "");
  }

  function signOut() {
    sessionStorage.removeItem(TOKEN_KEY);
    notice("Signed out: the token is gone from this tab.");
    signedOut(null);
  }

  // ---------------------------------------------------------------- time

  function age(iso) {
    const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (seconds < 60) return seconds + " s";
    const minutes = Math.floor(seconds / 60);
    if (minutes < 60) return minutes + " min";
    const hours = Math.floor(minutes / 60);
    if (hours < 48) return hours + " h " + (minutes % 60) + " min";
    return Math.floor(hours / 24) + " days";
  }

  function when(iso) {
    const date = new Date(iso);
    return isNaN(date) ? String(iso) : date.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }

  // ---------------------------------------------------------------- list

  // What the list shows now: filters, the rows read, and where we are.
  function emptyList() {
    return {
      filter: { state: "unknown", route: "", key: "" },
      // Held work: every row read, oldest first, paged here.
      rows: [],
      offset: 0,
      // The cursor reading held work stopped at (the older rows are past
      // it), or null when it was read whole.
      older: null,
      // How many of `rows` (first) a probe found more than once.
      duplicated: 0,
      // Other states: the API's pages, newest first; cursors of pages seen.
      cursors: [null],
      page: 0,
      next: null,
    };
  }

  const list = emptyList();

  function query(filter, limit, cursor) {
    const params = new URLSearchParams();
    if (filter.state) params.set("state", filter.state);
    if (filter.route) params.set("route", filter.route);
    if (filter.key) params.set("key", filter.key);
    params.set("limit", String(limit));
    if (cursor) params.set("cursor", cursor);
    return "/admin/keys?" + params.toString();
  }

  function held() {
    return list.filter.state === "unknown";
  }

  // The list as filtered; `keepPlace` (back from an operation) stays on
  // the page shown before, otherwise the first.
  async function loadList(keepPlace) {
    $("list-title").textContent = held() ? "Held work" : "Operations";
    $("list-summary").textContent = "Loading…";
    if (held()) {
      // The API lists newest first: read every held operation (bounded)
      // through its cursor and show the oldest first.
      const rows = [];
      let cursor = null;
      let pages = 0;
      do {
        const page = await api("GET", query(list.filter, HELD_PAGE, cursor));
        rows.push(...page.items);
        cursor = page.next_cursor;
        pages += 1;
      } while (cursor && pages < HELD_PAGES);
      list.older = cursor;
      // Found more than once at the destination: first, as the API
      // lists them; then the rest, oldest first.
      const duplicated = rows.filter((row) => row.duplicated_at_destination);
      const rest = rows.filter((row) => !row.duplicated_at_destination);
      list.duplicated = duplicated.length;
      list.rows = duplicated.concat(rest.reverse());
      const last = Math.max(0, Math.ceil(list.rows.length / PAGE) - 1) * PAGE;
      list.offset = keepPlace ? Math.min(list.offset, last) : 0;
    } else {
      if (!keepPlace) {
        list.cursors = [null];
        list.page = 0;
      }
      await loadApiPage();
      return;
    }
    await renderList();
  }

  async function loadApiPage() {
    const page = await api("GET", query(list.filter, PAGE, list.cursors[list.page]));
    list.rows = page.items;
    list.offset = 0;
    list.next = page.next_cursor;
    await renderList();
  }

  async function renderList() {
    const shown = held() ? list.rows.slice(list.offset, list.offset + PAGE) : list.rows;
    // Evidence and next action are in each operation's detail: asked
    // without its request body, which may be megabytes each.
    const details = await Promise.all(
      shown.map((row) =>
        api("GET", "/admin/keys/" + segment(row.id) + "?body=omit").catch((error) => {
          // Signed out meanwhile: the rows, read with the token, are not
          // shown either. Another failure leaves one row's detail out.
          if (error instanceof ApiError && error.status === 401) throw error;
          return null;
        })),
    );
    const body = $("operations").tBodies[0];
    body.replaceChildren(
      ...shown.map((row, i) => operationRow(row, details[i])),
    );
    let summary;
    if (held()) {
      const total = list.rows.length;
      summary = total === 0
        ? "No held operations: nothing is waiting for an operator."
        : total + " held operation" + (total === 1 ? "" : "s") +
          (list.duplicated
            ? ", the " + list.duplicated + " found more than once at the destination first, then oldest first; showing "
            : ", oldest first; showing ") +
          (list.offset + 1) + "–" + (list.offset + shown.length) + ".";
      if (list.older) {
        const narrowed = list.filter.route || list.filter.key;
        summary += " Only the newest " + HELD_PAGE * HELD_PAGES + " were read" +
          (narrowed ? "" : " (filtering by route or key narrows the list)") +
          "; the older ones are listed by: " + olderCommand() + ".";
      }
    } else {
      summary = shown.length === 0
        ? "No operations match."
        : "Newest first; page " + (list.page + 1) + ", " + shown.length + " operation" +
          (shown.length === 1 ? "" : "s") + ".";
    }
    $("list-summary").textContent = summary;
    $("page-previous").disabled = held() ? list.offset === 0 : list.page === 0;
    $("page-next").disabled = held() ? list.offset + PAGE >= list.rows.length : !list.next;
  }

  // The command that lists the held operations past those read.
  function olderCommand() {
    let command = "idemgate keys list --state unknown";
    if (list.filter.route) command += " --route " + shellWord(list.filter.route);
    if (list.filter.key) command += " --key " + shellWord(list.filter.key);
    return command + " --cursor " + shellWord(list.older);
  }

  // `text` as one word of a shell command line.
  function shellWord(text) {
    return /^[\w.\/:=@%+-]+$/.test(text) ? text : "'" + text.replace(/'/g, "'\\''") + "'";
  }

  // A table row: one cell per column, labelled with it (the narrow
  // layout shows the label beside the value).
  function tableRow(columns, ...values) {
    return el("tr", {}, ...values.map((value, n) => el("td", { "data-label": columns[n] }, value)));
  }

  // The head of `table`: one column header per label.
  function tableHead(table, columns) {
    table.tHead.rows[0].replaceChildren(...columns.map((label) => el("th", { scope: "col" }, label)));
  }

  function operationRow(row, detail) {
    const link = el("a", { href: "#/op/" + encodeURIComponent(row.id), class: "key" }, row.key);
    return tableRow(
      OPERATION_COLUMNS,
      link,
      row.route,
      el("span", { class: "state state-" + row.state }, row.state),
      el("time", { datetime: row.created_at, title: when(row.created_at) }, age(row.created_at)),
      detail ? detail.evidence : "(could not be read)",
      el("span", { class: "next" }, detail ? detail.next_action : ""),
    );
  }

  async function filterList(event) {
    event.preventDefault();
    list.filter = {
      state: $("filter-state").value,
      route: $("filter-route").value.trim(),
      key: $("filter-key").value.trim(),
    };
    await guarded(() => loadList(false));
  }

  // The "Held work" link: held work, unfiltered, from its first page,
  // whatever list was shown before (the address may not change, so no
  // hashchange would say it).
  function heldWork(event) {
    list.filter = { state: "unknown", route: "", key: "" };
    list.offset = 0;
    $("filter-route").value = "";
    $("filter-key").value = "";
    if (location.hash === "#/held") {
      event.preventDefault();
      route();
    }
  }

  async function pageBy(step) {
    if (held()) {
      list.offset = Math.max(0, list.offset + step * PAGE);
      await guarded(renderList);
    } else {
      if (step > 0) {
        if (!list.next) return;
        list.cursors[list.page + 1] = list.next;
      }
      list.page = Math.max(0, list.page + step);
      await guarded(loadApiPage);
    }
  }

  // ---------------------------------------------------------------- one operation

  let current = null;
  // The operation the settle form was last filled for: another one gets
  // an empty form (the operator's name kept), never the last one's
  // outcome, reference, note or response.
  let formFor = null;

  function resetSettleForm() {
    for (const radio of document.querySelectorAll('input[name="outcome"]')) {
      radio.checked = radio.value === "completed";
    }
    for (const field of ["settle-reference", "settle-note", "settle-status", "settle-body", "settle-tool-text", "settle-tool-structured"]) {
      $(field).value = "";
    }
    $("settle-tool-error").checked = false;
    show($("settle-error"), "");
  }

  const EVENT_WORDS = {
    claimed: "Claimed",
    sent: "Sent upstream",
    response: "Response recorded",
    timeout: "Lost: no answer in time",
    reset: "Lost: the connection broke",
    truncated: "Lost: the response was cut short",
    "gateway-restarted": "Lost: the gateway restarted",
    probe: "Reconcile probe",
    "late-response": "Late response",
    resolved: "Resolved by an operator",
    superseded: "Superseded",
    "connect-failed": "Could not connect",
    "upstream-busy": "Not sent: every upstream connection in use",
    "route-paused": "Route paused",
    "owner-lost": "Gateway lost",
    "record-lost": "Record lost (its gateway holds no attempt of it)",
    "forward-task-died": "Forwarding task died",
  };

  function words(kind) {
    return EVENT_WORDS[kind] || String(kind);
  }

  // An event's detail as `name: value` text.
  function detailText(detail) {
    if (detail === null || detail === undefined) return "";
    if (typeof detail !== "object") return String(detail);
    return Object.entries(detail)
      .filter(([, value]) => value !== null && value !== undefined)
      .map(([name, value]) => name + ": " + (typeof value === "object" ? JSON.stringify(value) : String(value)))
      .join("; ");
  }

  // One probe question and its answer, in words.
  function answerText(answer) {
    const said = answer.error ? "no answer (" + answer.error + ")"
      : "status " + answer.status + (answer.count !== null && answer.count !== undefined
        ? ", count " + answer.count : "");
    return "asked " + answer.url + ": " + said;
  }

  // A probe's timeline entry: its question and answer, the confirm
  // request's, and what the probe concluded.
  function probeText(detail) {
    if (!detail.verdict) return detailText(detail);
    // The latest of a run of probes stands for those after the run's first.
    let text = detail.probes > 1 ? detail.probes + " probes after the one above, the latest: " : "";
    text += answerText(detail);
    if (detail.confirm) {
      text += "; confirm " + answerText(detail.confirm) +
        (detail.confirm.absent ? " (says absent)" : " (does not say absent)");
    }
    text += " — verdict: " + detail.verdict;
    if (detail.reason) text += " (" + detail.reason + ")";
    return text;
  }

  function fact(name, value) {
    return [el("dt", {}, name), el("dd", {}, value === null || value === undefined ? "—" : String(value))];
  }

  // Whether the address still names operation `id`: an answer that
  // arrives after the operator moved on is not shown.
  function showing(id) {
    return location.hash.startsWith("#/op/") && decodeURIComponent(location.hash.slice(5)) === id;
  }

  async function openOperation(id) {
    showView("operation", false);
    show($("settle-result"), "");
    // Nothing of the operation shown before stays under this address,
    // least of all its settle form, until this one is read.
    current = null;
    $("operation-title").textContent = "Operation";
    $("operation-facts").replaceChildren();
    $("timeline").replaceChildren();
    $("settle").hidden = true;
    const op = await api("GET", "/admin/keys/" + segment(id));
    if (!showing(id)) return;
    current = op;
    renderOperation(op);
    $("operation-title").focus();
  }

  function renderOperation(op) {
    // The whole key is in the facts; a long one is cut short here.
    const key = op.key.length > 40 ? op.key.slice(0, 40) + "…" : op.key;
    $("operation-title").textContent = "Operation " + key;
    const request = op.request || {};
    const response = op.response;
    $("operation-facts").replaceChildren(
      ...fact("State", op.state),
      ...fact("Route", op.route),
      ...fact("Idempotency key", op.key),
      ...fact("Operation id", op.id),
      ...(op.destination_key ? fact("Destination key",
        op.destination_key.value + " (sent in " + op.destination_key.header + ")") : []),
      ...fact("Attempts", op.attempts),
      ...fact("Created", when(op.created_at) + " (" + age(op.created_at) + " ago)"),
      ...fact("Updated", when(op.updated_at)),
      ...fact("Evidence", op.evidence),
      ...fact("Next action", op.next_action),
      ...fact("Request", request.method + " " + request.path +
        (request.content_type ? " (" + request.content_type + ")" : "") +
        ", " + request.body_size + " bytes, sha256 " + request.body_sha256),
      ...(request.body !== undefined ? fact("Request body", request.body) : []),
      ...(request.body_base64 !== undefined
        ? fact("Request body", "(not UTF-8, in base64) " + request.body_base64)
        : []),
      ...fact("Response status", response ? response.status +
        (response.body_stored ? "" : " (body not stored)") : "none recorded"),
    );
    $("timeline").replaceChildren(
      ...(op.events || []).map((event) =>
        el(
          "li",
          {},
          el("time", { datetime: event.at }, when(event.at)),
          " ",
          el("strong", {}, words(event.kind)),
          event.detail && Object.keys(event.detail).length
            ? el("span", { class: "detail" }, " — " +
              (event.kind === "probe" ? probeText(event.detail) : detailText(event.detail)))
            : null,
        ),
      ),
    );
    // Held operations can be settled: `unknown`, or `in_progress` whose
    // gateway died. Which gateway is alive only the API knows: an
    // in-flight one is offered with that said, and a refusal shown as it
    // comes.
    $("settle").hidden = !(op.state === "unknown" || op.state === "in_progress");
    $("settle-in-flight").hidden = op.state !== "in_progress";
    if (formFor !== op.id) resetSettleForm();
    formFor = op.id;
    syncOutcome();
  }

  function outcome() {
    const checked = document.querySelector('input[name="outcome"]:checked');
    return checked ? checked.value : "completed";
  }

  // Whether the operation shown is an MCP tool call: settled with a tool
  // result, which the API requires of it, not an HTTP response.
  function toolCall() {
    return Boolean(current && current.profile === "mcp");
  }

  function syncOutcome() {
    const completed = outcome() === "completed";
    $("settle-response").hidden = !completed || toolCall();
    $("settle-tool-result").hidden = !completed || !toolCall();
  }

  // The resolution the form describes, or an error message.
  function resolution() {
    const body = { outcome: outcome(), operator: $("settle-operator").value.trim() };
    if (!body.operator) return "Type your name as the operator: the timeline records who settled it.";
    const reference = $("settle-reference").value.trim();
    const note = $("settle-note").value.trim();
    if (reference) body.reference = reference;
    if (note) body.note = note;
    if (body.outcome === "completed" && toolCall()) {
      const text = $("settle-tool-text").value;
      const structured = $("settle-tool-structured").value.trim();
      const isError = $("settle-tool-error").checked;
      if (text || structured || isError) {
        body.result = { content: text ? [{ type: "text", text }] : [], isError };
      }
      if (structured) {
        let parsed;
        try {
          parsed = JSON.parse(structured);
        } catch (_) {
          return "The structured content is not JSON.";
        }
        if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
          return "The structured content is a JSON object, as the tool's outputSchema describes it.";
        }
        body.result.structuredContent = new RawJson(structured);
        // A tool that returns structured content also returns it as text
        // (the MCP specification): a model reads the text.
        if (!text) body.result.content = [{ type: "text", text: structured }];
      }
    } else if (body.outcome === "completed") {
      const status = $("settle-status").value.trim();
      const text = $("settle-body").value;
      if (status || text) {
        const code = Number(status || "200");
        if (!Number.isInteger(code) || code < 200 || code > 599) {
          return "The response status is a whole number from 200 to 599.";
        }
        if (text && [204, 205, 304].includes(code)) {
          return "Status " + code + " has no content: a replay could not send a body. Leave the body empty.";
        }
        const response = { status: code };
        if (text) {
          // Sent as a string, the body is stored as typed, with no content
          // type; JSON gets its type here. Sent as the parsed value it
          // would not be the JSON typed: a string is stored without its
          // quotes, null as no body, and the rest re-serialised (numbers
          // made doubles here, keys sorted by the API).
          response.body = text;
          if (parsesAsJson(text)) response.headers = { "content-type": "application/json" };
        }
        body.response = response;
      }
    }
    return body;
  }

  function parsesAsJson(text) {
    try {
      JSON.parse(text);
      return true;
    } catch (_) {
      return false;
    }
  }

  // What the client's next retry gets once `body` is stored, in words.
  function consequence(op, body) {
    const retry = "The client's next retry with key “" + op.key + "” on route “" + op.route + "”";
    if (body.outcome === "not_attempted") {
      return retry + " will be sent to the upstream again, as attempt " + (op.attempts + 1) +
        ". Choose this only if the destination shows the operation did not happen.";
    }
    if (body.result) {
      const text = body.result.content.length ? body.result.content[0].text : "";
      const structured = body.result.structuredContent ? " with its structured content" :
        " with no structured content (an MCP client refuses that, unless isError, from a tool that declares an outputSchema)";
      return retry + " will get the tool result “" +
        (text.length > 200 ? text.slice(0, 200) + "…" : text) + "” (isError: " +
        body.result.isError + ")" + structured + ", replayed; nothing is sent to the server.";
    }
    if (toolCall()) {
      return retry + " will get the gateway's own tool result saying the call already ran and succeeded " +
        "(confirmed by " + body.operator + (body.reference ? ", reference " + body.reference : "") +
        "), that its result was lost and that it must not be called again (isError: true, which every " +
        "MCP client takes), replayed; nothing is sent to the server.";
    }
    if (body.response) {
      const typed = body.response.body;
      const quoted = typed === undefined ? "" : " “" +
        (typed.length > 200 ? typed.slice(0, 200) + "…" : typed) + "”";
      const kind = typed === undefined ? "an empty body" :
        body.response.headers ? "the body you typed" + quoted + ", as JSON (content-type: application/json)"
          : "the body you typed" + quoted + ", as text, with no content type";
      return retry + " will get status " + body.response.status + " with " + kind +
        ", replayed (Idempotent-Replayed: true); nothing is sent upstream.";
    }
    return retry + " will get status 200 with {\"resolved_by\": \"" + body.operator +
      "\", \"reference\": " + (body.reference ? "\"" + body.reference + "\"" : "null") +
      "}, replayed (Idempotent-Replayed: true); nothing is sent upstream.";
  }

  function confirm(text) {
    const dialog = $("confirm");
    $("confirm-text").textContent = text;
    return new Promise((resolve) => {
      const done = (answer) => {
        $("confirm-ok").onclick = null;
        $("confirm-cancel").onclick = null;
        dialog.onclose = null;
        if (dialog.open) dialog.close();
        resolve(answer);
      };
      $("confirm-ok").onclick = () => done(true);
      $("confirm-cancel").onclick = () => done(false);
      // Escape closes the dialog: that is a cancel.
      dialog.onclose = () => done(false);
      dialog.showModal();
      $("confirm-cancel").focus();
    });
  }

  async function settle(event) {
    event.preventDefault();
    show($("settle-error"), "");
    show($("settle-result"), "");
    const op = current;
    if (!op) return;
    const body = resolution();
    if (typeof body === "string") {
      show($("settle-error"), body);
      return;
    }
    if (!(await confirm(consequence(op, body)))) {
      // Signing out closes the dialog too: then nothing is said.
      if (current === op) show($("settle-result"), "Not settled: cancelled.");
      return;
    }
    // The attempt this page shows, the one the operator checked: if a
    // retry has moved the operation on since, the API refuses it.
    body.attempt = op.attempts;
    try {
      const settled = await api("POST", "/admin/keys/" + segment(op.id) + "/resolve", body);
      if (showing(op.id)) {
        current = settled;
        renderOperation(settled);
      }
      show($("settle-result"), "Settled as " + body.outcome + ". " +
        (body.outcome === "completed"
          ? "The client's next retry gets the replay."
          : "The client's next retry is sent upstream."));
    } catch (error) {
      if (error.kind === "operation-changed") {
        show($("settle-result"), "Not settled (409 Conflict): the operation moved on since this page " +
          "was read — a client retry was sent again, as a later attempt nobody has checked. " +
          sentence(error.message) + " Below is the operation as it is now: check that attempt " +
          "at the destination before settling it.");
        await openAgain(op.id);
      } else if (error.kind === "attempt-may-still-land") {
        // The detail says until when; Retry-After, how long that is.
        const wait = error.retryAfter === null ? "after that time"
          : "in about " + waitText(error.retryAfter);
        show($("settle-result"), "Not settled (409 Conflict): " + sentence(error.message) +
          " not_attempted is taken " + wait + "; completed is taken now.");
      } else if (error.kind === "not-resolvable") {
        const now = await openAgain(op.id);
        const state = now ? now.state : null;
        let why;
        if (state === "in_progress") {
          why = "it is in_progress: in flight, and its gateway is alive. Only an in-progress " +
            "operation whose gateway died can be settled; wait for it to finish or become unknown.";
        } else if (state) {
          why = "it is " + state + " now: settled first — by a client retry, evidence that " +
            "came late, or another operator.";
        } else {
          why = sentence(error.message);
        }
        show($("settle-result"), "Not settled (409 Conflict): " + why +
          (now ? " Below is the operation as it is now." : ""));
      } else if (error.status === 409) {
        show($("settle-result"), "Not settled (409 Conflict): " + sentence(error.message) +
          " Below is the operation as it is now.");
        await openAgain(op.id);
      } else if (error.status === 0) {
        // The request may have reached the gateway and been taken: only
        // the operation as stored says.
        const now = await openAgain(op.id);
        show($("settle-result"), "No answer: it may or may not be settled. " +
          sentence(error.message) + " " + (now
          ? "Read again: it is " + now.state + " now" + (now.state === op.state
            ? ", so it was not settled; settle it again if you still mean to."
            : " — see the timeline for who settled it.")
          : "Read it again (reload) before settling it again."));
      } else if (error.status !== 401) {
        show($("settle-result"), "Not settled (" + error.status + "): " + error.message);
      }
    }
    $("settle-result").focus();
  }

  // Reads operation `id` again and shows it: the operation, or null.
  async function openAgain(id) {
    try {
      const op = await api("GET", "/admin/keys/" + segment(id));
      if (!showing(id)) return null;
      current = op;
      renderOperation(current);
      return current;
    } catch (_) {
      // The message above already says what happened.
      return null;
    }
  }

  // A wait of `seconds`, in words.
  function waitText(seconds) {
    if (seconds < 120) return seconds + " s";
    const minutes = Math.round(seconds / 60);
    return minutes < 120 ? minutes + " min" : Math.round(minutes / 60) + " h";
  }

  // ---------------------------------------------------------------- routes

  let refreshTimer = null;

  // Who paused a route (the API's `paused_by`), in words.
  const PAUSED_BY = {
    operator: "operator: ",
    latch: "pause latch: ",
    probe: "probe (a write found more than once at the destination): ",
  };

  function stopRefresh() {
    if (refreshTimer !== null) clearInterval(refreshTimer);
    refreshTimer = null;
  }

  // Every configured route, then those no longer configured whose pause
  // or operations the store still holds (renamed or removed from the
  // file): such a pause lasts until it is resumed under the old name.
  async function loadRoutes() {
    const stats = await api("GET", "/admin/stats");
    const routes = stats.routes || [];
    const byRoute = stats.by_route || {};
    $("routes").tBodies[0].replaceChildren(
      ...routes.map((route) => {
        const counts = byRoute[route.name] || {};
        const why = route.paused
          ? (PAUSED_BY[route.paused_by] || String(route.paused_by) + ": ") + (route.reason || "")
          : "—";
        return tableRow(
          ROUTE_COLUMNS,
          el("strong", {}, route.name),
          route.configured ? el("code", {}, route.path_prefix) : el("em", {}, "no longer configured"),
          el("span", { class: route.paused ? "state state-paused" : "state" },
            route.paused ? "Paused" : "Not paused"),
          why,
          ...STATES.map((state) => String(counts[state] || 0)),
        );
      }),
    );
    // A route no longer configured can be resumed, not paused.
    const choices = routes.filter((route) => route.configured || route.paused);
    const select = $("pause-route");
    const chosen = select.value;
    select.replaceChildren(...choices.map((route) =>
      el("option", { value: route.name, "data-resume-only": !route.configured },
        route.name + (route.configured
          ? (route.paused ? " (paused)" : "")
          : " (paused; no longer configured: resume only)"))));
    if (choices.some((route) => route.name === chosen)) select.value = chosen;
    syncPauseForm();
    const oldest = stats.oldest_unknown_age_seconds;
    $("routes-summary").textContent =
      (oldest === null || oldest === undefined
        ? "No operation is unknown."
        : "Oldest unknown operation: " + age(new Date(Date.now() - oldest * 1000).toISOString()) + " old.") +
      " Counts refresh every " + REFRESH_MS / 1000 + " s; last read " +
      when(new Date().toISOString()) + ".";
  }

  // Whether the route chosen is no longer configured: it can be resumed only.
  function resumeOnly() {
    const option = $("pause-route").selectedOptions[0];
    return Boolean(option && option.hasAttribute("data-resume-only"));
  }

  function syncPauseForm() {
    $("pause-button").disabled = resumeOnly();
  }

  async function pauseOrResume(event) {
    event.preventDefault();
    const action = event.submitter ? event.submitter.value : "pause";
    const name = $("pause-route").value;
    if (!name) return;
    const reason = $("pause-reason").value.trim();
    if (action === "resume" && reason) {
      // The API refuses it too: a resume keeps no reason.
      show($("pause-result"), "Not done: a resume takes no reason (only a pause keeps one). " +
        "Clear the reason to resume " + name + ".");
      return;
    }
    const path = "/admin/routes/" + segment(name) + "/" + action;
    try {
      const result = await api("POST", path, action === "pause" && reason ? { reason } : undefined);
      show($("pause-result"), result.paused
        ? "Route " + result.route + " is paused: " + result.reason + ". New writes get 503 route-paused; stored responses are still replayed."
        : "Route " + result.route + " is resumed: " + (resumeOnly()
          ? "no longer configured, it takes no writes under this name."
          : "new writes are sent again."));
      $("pause-reason").value = "";
      await loadRoutes();
    } catch (error) {
      if (error.status !== 401) {
        show($("pause-result"), "Not done (" + (error.status || "no answer") + "): " + error.message);
      }
    }
  }

  // ---------------------------------------------------------------- routing

  // Runs `work`; an API failure other than a refused token is shown.
  async function guarded(work) {
    try {
      await work();
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) return;
      notice("Error: " + error.message);
    }
  }

  async function route() {
    stopRefresh();
    notice("");
    if (!token()) {
      showView("sign-in", true);
      return;
    }
    const hash = location.hash || "#/held";
    if (hash.startsWith("#/op/")) {
      await guarded(() => openOperation(decodeURIComponent(hash.slice(5))));
    } else if (hash === "#/routes") {
      showView("routes", true);
      await guarded(loadRoutes);
      refreshTimer = setInterval(() => guarded(loadRoutes), REFRESH_MS);
    } else {
      showView("list", true);
      $("filter-state").value = list.filter.state;
      // `#/list` is the way back from an operation: the list as it was.
      await guarded(() => loadList(hash === "#/list"));
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    tableHead($("operations"), OPERATION_COLUMNS);
    tableHead($("routes"), ROUTE_COLUMNS);
    // Held work first, then the other states, then any.
    $("filter-state").replaceChildren(
      ...["unknown", ...STATES.filter((state) => state !== "unknown")].map((state) =>
        el("option", { value: state }, state === "unknown" ? "unknown (held)" : state)),
      el("option", { value: "" }, "any state"),
    );
    $("sign-in-form").addEventListener("submit", signIn);
    $("sign-out").addEventListener("click", signOut);
    $("nav-held").addEventListener("click", heldWork);
    $("filter-form").addEventListener("submit", filterList);
    $("page-previous").addEventListener("click", () => pageBy(-1));
    $("page-next").addEventListener("click", () => pageBy(1));
    $("settle-form").addEventListener("submit", settle);
    for (const radio of document.querySelectorAll('input[name="outcome"]')) {
      radio.addEventListener("change", syncOutcome);
    }
    $("pause-form").addEventListener("submit", pauseOrResume);
    $("pause-route").addEventListener("change", syncPauseForm);
    window.addEventListener("hashchange", route);
    route();
  });
})();
