// sendgate's status page: polls /health/detailed every 2 s and redraws the page's
// #status region, keeping ~5 minutes of backlog samples per queue for a chart (inline SVG).
//
// Built with DOM calls and textContent only (no innerHTML): every value from the server
// is text. The markup mirrors src/http/console/render.rs (the server's render of the same
// JSON, shown before this script runs or without it).
//
// With API keys on (body[data-auth="keys"]) the observer token is asked for in a form,
// kept in sessionStorage (this tab only) and sent as `Authorization: Bearer` — never in a
// URL. A 401/403 forgets it, clears the data and says why.
"use strict";

(function () {
  var POLL_MS = 2000;
  var WINDOW_MS = 5 * 60 * 1000;
  var MAX_POINTS = 200; // 5 minutes at 2 s is 150; the bound holds whatever the timer does
  var TOKEN_KEY = "sendgate.observerToken";
  var SVG = "http://www.w3.org/2000/svg";

  var keysOn = document.body.getAttribute("data-auth") === "keys";
  var statusRegion = document.getElementById("status");
  var fetchError = document.getElementById("fetch-error");
  var form = document.getElementById("token-form");
  var tokenInput = document.getElementById("token");
  var authError = document.getElementById("auth-error");
  var signedIn = document.getElementById("signed-in");
  var forgetButton = document.getElementById("forget-token");

  // "backend/queue" -> [{t: ms, v: backlog or null}], oldest first.
  var samples = new Map();
  var timer = null;
  var generation = 0;

  // ---- the token ----------------------------------------------------------------

  function storedToken() {
    try {
      return window.sessionStorage.getItem(TOKEN_KEY);
    } catch (e) {
      return null;
    }
  }

  function storeToken(token) {
    try {
      if (token === null) {
        window.sessionStorage.removeItem(TOKEN_KEY);
      } else {
        window.sessionStorage.setItem(TOKEN_KEY, token);
      }
    } catch (e) {
      /* storage off: the token lives only as long as this page */
    }
  }

  var memoryToken = null;

  function token() {
    return storedToken() || memoryToken;
  }

  function askForToken(message) {
    if (!form) return;
    form.hidden = false;
    if (signedIn) signedIn.hidden = true;
    if (authError) authError.textContent = message || "";
    tokenInput.value = "";
    tokenInput.focus();
  }

  function tokenAccepted() {
    if (!form) return;
    form.hidden = true;
    if (signedIn) signedIn.hidden = false;
    if (authError) authError.textContent = "";
  }

  function forget(message) {
    memoryToken = null;
    storeToken(null);
    // The admin token too (the settings form's): "forget" leaves no token in this tab.
    try {
      window.sessionStorage.removeItem("sendgate.adminToken");
    } catch (e) {
      /* storage off: nothing kept */
    }
    var typedAdmin = document.getElementById("admin-token");
    if (typedAdmin) typedAdmin.value = "";
    stop();
    samples.clear();
    showNoData("No data: enter an observer token.");
    askForToken(message);
  }

  if (form) {
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var value = tokenInput.value.trim();
      if (!value) {
        authError.textContent = "Enter a token.";
        tokenInput.focus();
        return;
      }
      memoryToken = value;
      storeToken(value);
      tokenInput.value = "";
      authError.textContent = "";
      poll();
    });
  }
  if (forgetButton) {
    forgetButton.addEventListener("click", function () {
      forget("Token forgotten.");
    });
  }

  // ---- polling ----------------------------------------------------------------------

  function stop() {
    generation += 1;
    if (timer !== null) {
      window.clearTimeout(timer);
      timer = null;
    }
  }

  function schedule(mine) {
    if (mine !== generation) return;
    timer = window.setTimeout(poll, POLL_MS);
  }

  function poll() {
    stop();
    var mine = generation;
    var headers = { Accept: "application/json" };
    if (keysOn) {
      var t = token();
      if (!t) {
        askForToken("");
        return;
      }
      headers.Authorization = "Bearer " + t;
    }
    window
      .fetch("/health/detailed", {
        headers: headers,
        cache: "no-store",
        credentials: "omit",
        redirect: "error",
      })
      .then(function (response) {
        if (mine !== generation) return;
        if (response.status === 401 || response.status === 403) {
          forget(
            "The gateway refused this token (" +
              response.status +
              (response.status === 401 ? " unauthenticated" : " forbidden: it needs the observer or admin role") +
              "). No data is shown."
          );
          return;
        }
        if (!response.ok) {
          throw new Error("the gateway answered " + response.status);
        }
        return response.json().then(function (body) {
          if (mine !== generation) return;
          fetchError.textContent = "";
          if (keysOn) tokenAccepted();
          record(body);
          render(body);
          if (!lastSettings) offerQueues(Object.keys(body.queues || {}).sort());
          schedule(mine);
        });
      })
      .catch(function (error) {
        if (mine !== generation) return;
        fetchError.textContent =
          "Could not refresh (" + error.message + "); showing the last data, retrying every 2 s.";
        schedule(mine);
      });
  }

  // ---- samples ----------------------------------------------------------------------

  function eachQueue(body, visit) {
    var backends = body.backends || {};
    Object.keys(backends)
      .sort()
      .forEach(function (role) {
        var queues = role === "primary" ? body.queues : backends[role].queues;
        Object.keys(queues || {})
          .sort()
          .forEach(function (name) {
            visit(role, name, queues[name]);
          });
      });
  }

  function record(body) {
    var now = Date.now();
    var seen = new Set();
    eachQueue(body, function (role, name, q) {
      var key = role + "/" + name;
      seen.add(key);
      var list = samples.get(key) || [];
      list.push({ t: now, v: typeof q.backlog === "number" ? q.backlog : null });
      while (list.length > MAX_POINTS || (list.length && now - list[0].t > WINDOW_MS)) {
        list.shift();
      }
      samples.set(key, list);
    });
    samples.forEach(function (_, key) {
      if (!seen.has(key)) samples.delete(key);
    });
  }

  // ---- rendering ----------------------------------------------------------------------

  function el(tag, attrs) {
    var node = document.createElement(tag);
    setAttrs(node, attrs);
    for (var i = 2; i < arguments.length; i++) append(node, arguments[i]);
    return node;
  }

  function setAttrs(node, attrs) {
    Object.keys(attrs || {}).forEach(function (name) {
      var value = attrs[name];
      if (value !== null && value !== undefined && value !== false) {
        node.setAttribute(name, value === true ? "" : String(value));
      }
    });
  }

  function append(node, child) {
    if (child === null || child === undefined || child === false) return;
    if (Array.isArray(child)) {
      child.forEach(function (c) {
        append(node, c);
      });
    } else if (typeof child === "string" || typeof child === "number") {
      node.appendChild(document.createTextNode(String(child)));
    } else {
      node.appendChild(child);
    }
  }

  function badge(good, text) {
    return el("span", { class: good ? "badge ok" : "badge bad" }, text);
  }

  function word(v) {
    return typeof v === "string" ? v : "?";
  }

  function number(v) {
    return typeof v === "number" ? String(v) : "?";
  }

  function orText(v, otherwise) {
    return typeof v === "string" ? v : otherwise;
  }

  // An RFC 3339 time to the second: "2026-12-01T06:24:28Z".
  function when(v, otherwise) {
    return typeof v === "string" ? v.replace(/\.\d+(?=Z|[+-]\d\d:\d\d$)/, "") : otherwise;
  }

  function seconds(s) {
    return s.toFixed(1) + " s";
  }

  function nowText() {
    return new Date().toISOString().replace(/\.\d+Z$/, "Z");
  }

  // The countdown: each poll (every 2 s) brings the window left.
  function drainText(drain) {
    if (!drain || typeof drain.remaining_s !== "number") return "not draining";
    return "draining: " + seconds(drain.remaining_s) + " left, " + number(drain.in_flight) + " in flight";
  }

  function showNoData(text) {
    statusRegion.replaceChildren(el("p", { class: "empty" }, text));
  }

  function render(d) {
    var status = word(d.status);
    var c = d.coordination || {};
    var nodes = [
      el(
        "p",
        { class: "summary" },
        "Gateway ",
        el("span", { class: status === "ok" ? "badge ok" : "badge bad", "data-field": "status" }, status),
        " · state ",
        el("strong", { "data-field": "gateway_state" }, word(d.gateway_state)),
        " · version " + word(d.version) + " · pid " + number(d.pid) + " · as of ",
        el("span", { "data-field": "as_of" }, nowText())
      ),
      el(
        "div",
        { class: "grid" },
        el(
          "section",
          { class: "card", "aria-labelledby": "lifecycle-title" },
          el("h2", { id: "lifecycle-title" }, "Lifecycle"),
          el(
            "dl",
            {},
            el("dt", {}, "State"),
            el("dd", {}, word(d.gateway_state)),
            el("dt", {}, "Drain"),
            el("dd", { "data-field": "drain" }, drainText(d.drain))
          )
        ),
        el(
          "section",
          { class: "card", "aria-labelledby": "coordination-title" },
          el("h2", { id: "coordination-title" }, "Coordination"),
          el(
            "dl",
            {},
            el("dt", {}, "Mode"),
            el("dd", { "data-field": "coordination_mode" }, word(c.mode)),
            el("dt", {}, "Healthy"),
            el("dd", { "data-field": "coordination_ok" }, badge(c.ok === true, c.ok === true ? "yes" : "no")),
            el("dt", {}, "Since"),
            el("dd", {}, when(c.since, "—")),
            el("dt", {}, "Last error"),
            el("dd", { "data-field": "coordination_error" }, orText(c.last_error, "none"))
          )
        ),
        overridesCard(d.settings || {})
      ),
    ];
    var backends = d.backends || {};
    Object.keys(backends)
      .sort()
      .forEach(function (role) {
        var queues = role === "primary" ? d.queues : backends[role].queues;
        nodes.push(backendSection(role, backends[role], queues || {}, (d.settings || {}).overridden || {}));
      });
    statusRegion.replaceChildren.apply(statusRegion, nodes);
  }

  // The overrides in force over another configured value, and those that lapsed at start-up
  // (render.rs's `overrides`).
  function overridesCard(s) {
    var overridden = s.overridden || {};
    var lapsed = s.lapsed || {};
    var differing = Object.keys(overridden)
      .sort()
      .filter(function (name) {
        return overridden[name].differs === true;
      });
    var lapsedNames = Object.keys(lapsed).sort();
    return el(
      "section",
      { class: "card", "aria-labelledby": "overrides-title" },
      el("h2", { id: "overrides-title" }, "Runtime overrides"),
      el("p", { "data-field": "overrides_lapse" }, "Lapse: " + word(s.lapse)),
      differing.length === 0
        ? el("p", { "data-field": "overriding" }, "None in force over the configuration.")
        : el(
            "ul",
            { "data-field": "overriding" },
            differing.map(function (name) {
                var o = overridden[name];
                return el(
                  "li",
                  {},
                  el("code", {}, name),
                  " = " + JSON.stringify(o.value) + " over the configured " + JSON.stringify(o.configured) +
                    " (by " + word(o.by) + ")"
                );
              })
          ),
      lapsedNames.length === 0
        ? null
        : el(
            "ul",
            { "data-field": "lapsed" },
            lapsedNames.map(function (name) {
                var l = lapsed[name];
                return el(
                  "li",
                  {},
                  el("code", {}, name),
                  " = " + JSON.stringify(l.value) + " lapsed at start-up: made against " +
                    JSON.stringify(l.made_against) + ", configured now " + JSON.stringify(l.configured)
                );
              })
          )
    );
  }

  function probeText(p) {
    if (!p || typeof p.ok !== "boolean") return "none yet";
    if (p.ok) return "ok at " + when(p.at, "—");
    return "failed at " + when(p.at, "—") + ": " + orText(p.error, "none");
  }

  function backendSection(role, b, queues, overridden) {
    var breaker = word(b.breaker);
    return el(
      "section",
      { class: "backend", "data-backend": role, "aria-label": "Backend " + role },
      el("h2", {}, "Backend " + role + ": " + word(b.kind)),
      el(
        "dl",
        { class: "facts" },
        el("dt", {}, "Breaker"),
        el(
          "dd",
          { "data-field": "breaker" },
          badge(breaker === "closed", breaker),
          typeof b.next_trial_in_s === "number" ? " · next trial in " + seconds(b.next_trial_in_s) : null
        ),
        el("dt", {}, "Sends in flight"),
        el("dd", { "data-field": "in_flight" }, number(b.sends_in_flight) + " of " + number(b.max_in_flight)),
        el("dt", {}, "Last probe"),
        el("dd", {}, probeText(b.probe))
      ),
      el(
        "div",
        { class: "queues" },
        Object.keys(queues)
          .sort()
          .map(function (name) {
            return queueCard(role, name, queues[name], overridden);
          })
      )
    );
  }

  function queueCard(role, name, q, overridden) {
    var ceilingSet = overridden["queues." + name + ".max_queue_depth"];
    var refusing = q.fail_closed === true;
    var hasBacklog = typeof q.backlog === "number";
    var streak =
      typeof q.streak_threshold === "number"
        ? number(q.consecutive_failures) + " of " + q.streak_threshold
        : number(q.consecutive_failures);
    var facts = [
      el("dt", {}, "Read failures in a row"),
      el("dd", { "data-field": "streak" }, streak),
      el("dt", {}, "Fail-closed gate"),
      el("dd", { "data-field": "fail_closed_enabled" }, q.fail_closed_enabled === true ? "on" : "off"),
      el("dt", {}, "Refusing now"),
      el(
        "dd",
        { "data-field": "refusing" },
        refusing ? badge(false, "yes: refusing sends (capacity unknown)") : badge(true, "no")
      ),
    ];
    if (typeof q.drain_rate_per_s === "number") {
      facts.push(
        el("dt", {}, "Drain rate (estimated)"),
        el("dd", { "data-field": "drain_rate" }, q.drain_rate_per_s.toFixed(1) + " messages/s")
      );
    }
    if (typeof q.refusing_until_backlog === "number") {
      facts.push(
        el("dt", {}, "Refusing until backlog"),
        el("dd", { "data-field": "refusing_until_backlog" }, String(q.refusing_until_backlog))
      );
    }
    facts.push(
      el("dt", {}, "Last good read"),
      el("dd", { "data-field": "last_read_ok_at" }, when(q.last_read_ok_at, "never"))
    );
    var limit = typeof q.limit === "number" ? q.limit : null;
    return el(
      "article",
      { class: "queue", "data-backend": role, "data-queue": name, "aria-label": "Queue " + name + " on " + role },
      el("h3", {}, "Queue " + name),
      el(
        "p",
        { class: "backlog-line" },
        "Backlog ",
        el("span", { class: "big", "data-field": "backlog" }, hasBacklog ? String(q.backlog) : "unknown"),
        " of ceiling ",
        el("span", { class: "big", "data-field": "limit" }, number(q.limit)),
        ceilingSet
          ? [" ", el("span", { class: "override", "data-field": "limit_overridden" }, "(runtime setting by " + word(ceilingSet.by) + ")")]
          : null
      ),
      hasBacklog && limit !== null
        ? el(
            "meter",
            {
              min: 0,
              max: limit,
              value: Math.min(q.backlog, limit),
              high: Math.floor((limit * 8) / 10),
              optimum: 0,
              "aria-label": "Backlog of " + name + " against its ceiling",
            },
            q.backlog + " of " + limit
          )
        : null,
      el("div", { class: "chart", "data-field": "chart" }, chart(samples.get(role + "/" + name) || [], limit, name)),
      el("dl", {}, facts),
      tenantTable(name, q.tenants)
    );
  }

  // A row per tenant the queue has answered (none before any send), as render.rs's.
  function tenantTable(queue, tenants) {
    if (!Array.isArray(tenants) || tenants.length === 0) return null;
    function th(text) {
      return el("th", { scope: "col" }, text);
    }
    // Six columns outgrow a narrow card: they scroll within it, not past its edge.
    return el("div", { class: "scroll" }, el(
      "table",
      { class: "tenants", "data-field": "tenants" },
      el("caption", {}, "Tenants of " + queue + ", per second over the last 10 s"),
      el(
        "thead",
        {},
        el("tr", {}, [
          th("Tenant"),
          th("Weight"),
          th("Admitted/s"),
          th("Refused/s"),
          th("Would refuse/s (shadow)"),
          th("Share now"),
        ])
      ),
      el(
        "tbody",
        {},
        tenants.map(function (t) {
          return el(
            "tr",
            { "data-tenant": word(t.name) },
            el("th", { scope: "row", "data-field": "tenant_name" }, word(t.name)),
            el("td", { "data-field": "tenant_weight" }, number(t.weight)),
            el("td", { "data-field": "tenant_admitted" }, rate(t.admitted_per_s)),
            el("td", { "data-field": "tenant_refused" }, byReason(t.refused_per_s)),
            el("td", { "data-field": "tenant_would_refuse" }, byReason(t.would_refuse_per_s)),
            el("td", { "data-field": "tenant_share" }, number(t.share))
          );
        })
      )
    ));
  }

  function rate(v) {
    return typeof v === "number" ? v.toFixed(1) : "?";
  }

  // Their sum, then each reason above zero: "0.5 (queue_full 0.2, tenant_share 0.3)".
  function byReason(reasons) {
    if (!reasons || typeof reasons !== "object") return "?";
    var sum = 0;
    var some = [];
    Object.keys(reasons).forEach(function (reason) {
      var r = reasons[reason];
      if (typeof r !== "number") return;
      sum += r;
      if (r > 0) some.push(reason + " " + r.toFixed(1));
    });
    return sum.toFixed(1) + (some.length ? " (" + some.join(", ") + ")" : "");
  }

  // The backlog over the window, against the ceiling (dashed). Time runs left to right,
  // now at the right edge; a failed read (backlog unknown) breaks the line.
  function chart(points, limit, name) {
    var W = 320;
    var H = 90;
    var now = Date.now();
    var known = points.filter(function (p) {
      return p.v !== null;
    });
    var top = Math.max(
      limit || 1,
      known.reduce(function (m, p) {
        return Math.max(m, p.v);
      }, 0)
    );
    top = top * 1.1;
    // The x axis spans the samples held (at least a minute, at most the window), so a
    // page opened a moment ago still shows a line across.
    var span = Math.min(WINDOW_MS, Math.max(60 * 1000, points.length ? now - points[0].t : 0));
    function x(t) {
      return (W * (1 - (now - t) / span)).toFixed(1);
    }
    function y(v) {
      return (H - (v / top) * H).toFixed(1);
    }
    var svg = document.createElementNS(SVG, "svg");
    var lo = known.length ? Math.min.apply(null, known.map(function (p) { return p.v; })) : null;
    var hi = known.length ? Math.max.apply(null, known.map(function (p) { return p.v; })) : null;
    var label =
      "Backlog of " +
      name +
      " over the last " +
      Math.round(points.length ? (now - points[0].t) / 1000 : 0) +
      " s: " +
      (known.length ? "from " + lo + " to " + hi : "no reading yet") +
      (limit !== null ? ", ceiling " + limit : "");
    svgAttrs(svg, {
      viewBox: "0 0 " + W + " " + H,
      role: "img",
      "aria-label": label,
      class: "spark",
      preserveAspectRatio: "none",
    });
    var title = document.createElementNS(SVG, "title");
    title.textContent = label;
    svg.appendChild(title);
    svg.appendChild(svgEl("rect", { x: 0, y: 0, width: W, height: H, class: "frame" }));
    if (limit !== null) {
      svg.appendChild(svgEl("line", { x1: 0, x2: W, y1: y(limit), y2: y(limit), class: "ceiling" }));
    }
    var run = [];
    function flush() {
      if (run.length === 1) {
        svg.appendChild(svgEl("circle", { cx: run[0].split(",")[0], cy: run[0].split(",")[1], r: 2, class: "dot" }));
      } else if (run.length > 1) {
        svg.appendChild(svgEl("polyline", { points: run.join(" "), class: "backlog" }));
      }
      run = [];
    }
    points.forEach(function (p) {
      if (p.v === null) {
        flush();
      } else {
        run.push(x(p.t) + "," + y(p.v));
      }
    });
    flush();
    return svg;
  }

  function svgEl(tag, attrs) {
    var node = document.createElementNS(SVG, tag);
    svgAttrs(node, attrs);
    return node;
  }

  function svgAttrs(node, attrs) {
    Object.keys(attrs).forEach(function (name) {
      node.setAttribute(name, String(attrs[name]));
    });
  }

  // ---- runtime settings (PATCH /admin/settings) ------------------------------------------
  //
  // The admin token is asked for only with keys on, kept in sessionStorage like the
  // observer token and sent only as `Authorization: Bearer`. A field left empty is left as
  // it is; "back to the default" sends null (the variable's value applies again).

  var ADMIN_KEY = "sendgate.adminToken";
  // Whole numbers, and shares of the ceiling (0-1), typed into a number field each.
  var WHOLE_FIELDS = ["max_queue_depth", "fail_closed_streak", "depth_ttl_ms"];
  var FRACTION_FIELDS = ["shed_at_sheddable", "shed_at_default", "fair_share_at"];
  var TYPED_FIELDS = WHOLE_FIELDS.concat(FRACTION_FIELDS);
  var QUEUE_FIELDS = ["fail_closed"].concat(TYPED_FIELDS);
  var settingsForm = document.getElementById("settings-form");
  var adminInput = document.getElementById("admin-token");
  var queueSelect = document.getElementById("settings-queue");
  var settingsResult = document.getElementById("settings-result");
  var settingsErrors = document.getElementById("settings-errors");
  var lastSettings = null;

  function adminToken() {
    var typed = adminInput ? adminInput.value.trim() : "";
    if (typed) return typed;
    try {
      return window.sessionStorage.getItem(ADMIN_KEY);
    } catch (e) {
      return null;
    }
  }

  function storeAdminToken(value) {
    try {
      if (value === null) {
        window.sessionStorage.removeItem(ADMIN_KEY);
      } else {
        window.sessionStorage.setItem(ADMIN_KEY, value);
      }
    } catch (e) {
      /* storage off: typed again next time */
    }
  }

  function adminHeaders() {
    var headers = { Accept: "application/json", "Content-Type": "application/json" };
    var t = keysOn ? adminToken() : null;
    if (t) headers.Authorization = "Bearer " + t;
    return headers;
  }

  // The queues to choose from: the settings' own, else the health snapshot's.
  function offerQueues(names) {
    if (!queueSelect || !names.length) return;
    var have = Array.prototype.map.call(queueSelect.options, function (o) {
      return o.value;
    });
    if (have.join("\n") === names.join("\n")) return;
    var chosen = queueSelect.value;
    queueSelect.replaceChildren.apply(
      queueSelect,
      names.map(function (n) {
        return el("option", { value: n }, n);
      })
    );
    if (names.indexOf(chosen) >= 0) queueSelect.value = chosen;
  }

  function describe(setting) {
    if (!setting) return "";
    var v = setting.value === null ? "none" : String(setting.value);
    var d = setting.default === null ? "none" : String(setting.default);
    var text = "In force: " + v + " (" + setting.variable + ": " + d + ")";
    if (setting.overridden) {
      text += "; overridden by " + setting.overridden.by + " at " + when(setting.overridden.at, "?");
    }
    return text;
  }

  function showSettings(body) {
    lastSettings = body;
    offerQueues(Object.keys(body.queues || {}).sort());
    var q = (body.queues || {})[queueSelect ? queueSelect.value : ""] || {};
    QUEUE_FIELDS.forEach(function (f) {
      var now = document.getElementById("set-" + f + "-now");
      if (now) now.textContent = describe(q[f]);
    });
    var force = document.getElementById("set-force_backend-now");
    if (force) force.textContent = describe(body.force_backend);
  }

  // A 401/403 on the admin routes: the token is forgotten and the form says why.
  function adminRefused(status, what) {
    storeAdminToken(null);
    if (adminInput) adminInput.value = "";
    showErrors([
      "The gateway refused this token (" +
        status +
        (status === 401 ? " unauthenticated" : " forbidden: it needs the admin role") +
        "). " +
        what,
    ]);
  }

  // The current values (and the queues) from GET /admin/settings; with keys on, once an
  // admin token is there. A token that works is kept for this tab.
  function loadSettings() {
    if (keysOn && !adminToken()) return;
    var typed = adminInput ? adminInput.value.trim() : "";
    window
      .fetch("/admin/settings", { headers: adminHeaders(), cache: "no-store", credentials: "omit", redirect: "error" })
      .then(function (response) {
        if (response.status === 401 || response.status === 403) {
          adminRefused(response.status, "The current values are not shown.");
          return null;
        }
        if (!response.ok) return null;
        return response.json();
      })
      .then(function (body) {
        if (!body) return;
        if (keysOn && typed) {
          storeAdminToken(typed);
          adminInput.value = "";
        }
        showErrors([]);
        showSettings(body);
      })
      .catch(function () {
        /* shown on the next Apply */
      });
  }

  function readPatch(problems) {
    var queue = queueSelect ? queueSelect.value : "";
    var changes = {};
    TYPED_FIELDS.forEach(function (f) {
      var input = document.getElementById("set-" + f);
      var back = document.getElementById("set-" + f + "-default");
      if (back && back.checked) {
        changes[f] = null;
      } else if (input && input.value.trim() !== "") {
        var text = input.value.trim();
        var n = Number(text);
        // A number as the browser's number field takes it (".5", "1e-1"); sent as typed
        // when it is none, or not whole where the field wants a whole one: the gateway's
        // 400 says what is wrong.
        var whole = FRACTION_FIELDS.indexOf(f) < 0;
        changes[f] = isFinite(n) && (!whole || Number.isInteger(n)) ? n : text;
      } else if (input && input.validity && input.validity.badInput) {
        // What the browser could not read as a number ("0,5"): said, not dropped.
        problems.push(f + ": not a number.");
      }
    });
    var gate = document.getElementById("set-fail_closed");
    if (gate && gate.value !== "") changes.fail_closed = gate.value === "null" ? null : gate.value === "true";
    var patch = {};
    if (Object.keys(changes).length) {
      if (!queue) {
        problems.push("Choose a queue.");
      } else {
        patch.queues = {};
        patch.queues[queue] = changes;
      }
    }
    var force = document.getElementById("set-force_backend");
    if (force && force.value !== "") patch.force_backend = force.value === "null" ? null : force.value;
    return patch;
  }

  function showErrors(lines) {
    settingsErrors.replaceChildren.apply(
      settingsErrors,
      lines.map(function (line) {
        return el("li", {}, line);
      })
    );
  }

  function clearInputs() {
    TYPED_FIELDS.forEach(function (f) {
      var input = document.getElementById("set-" + f);
      var back = document.getElementById("set-" + f + "-default");
      if (input) input.value = "";
      if (back) back.checked = false;
    });
    ["set-fail_closed", "set-force_backend"].forEach(function (id) {
      var select = document.getElementById(id);
      if (select) select.value = "";
    });
  }

  if (settingsForm) {
    settingsForm.hidden = false;
    if (queueSelect) {
      queueSelect.addEventListener("change", function () {
        if (lastSettings) showSettings(lastSettings);
      });
    }
    if (adminInput) {
      adminInput.addEventListener("change", function () {
        if (adminInput.value.trim()) loadSettings();
      });
    }
    settingsForm.addEventListener("submit", function (event) {
      event.preventDefault();
      settingsResult.textContent = "";
      showErrors([]);
      if (keysOn && !adminToken()) {
        showErrors(["Enter an admin token."]);
        if (adminInput) adminInput.focus();
        return;
      }
      var problems = [];
      var patch = readPatch(problems);
      if (problems.length) {
        showErrors(problems);
        return;
      }
      if (!Object.keys(patch).length) {
        showErrors(["Nothing to change: fill in a field, or choose \u201cback to the default\u201d."]);
        return;
      }
      var typed = adminInput ? adminInput.value.trim() : "";
      window
        .fetch("/admin/settings", {
          method: "PATCH",
          headers: adminHeaders(),
          body: JSON.stringify(patch),
          cache: "no-store",
          credentials: "omit",
          redirect: "error",
        })
        .then(function (response) {
          return response
            .json()
            .catch(function () {
              return {};
            })
            .then(function (body) {
              if (response.status === 401 || response.status === 403) {
                adminRefused(response.status, "Nothing changed.");
                return;
              }
              if (!response.ok) {
                var lines = (body.errors || []).map(function (e) {
                  return (e.loc || []).slice(1).join(".") + ": " + e.msg;
                });
                showErrors(lines.length ? lines : [(body.message || "The gateway answered " + response.status) + " Nothing changed."]);
                return;
              }
              if (keysOn && typed) {
                storeAdminToken(typed);
                adminInput.value = "";
              }
              var changed = body.changed || [];
              settingsResult.textContent = changed.length
                ? "Changed: " + changed.join(", ") + ". In force from the next send."
                : "Nothing changed: the values were already in force.";
              clearInputs();
              showSettings(body);
            });
        })
        .catch(function (error) {
          showErrors(["Could not reach the gateway (" + error.message + "). Nothing changed."]);
        });
    });
    loadSettings();
  }

  // ---- start ----------------------------------------------------------------------------

  if (keysOn && !token()) {
    askForToken("");
  } else {
    poll();
  }
})();
