/*
 * berth's Cockpit page: plain JavaScript on cockpit.js, no build step.
 *
 * Everything comes from berth's D-Bus API on the system bus, through the
 * bridge (cockpit.dbus): dev.berth.Scheduler1, dev.berth.Intake1 and, where
 * installed, dev.berth.Images1, plus org.freedesktop.systemd1 for the units.
 * berth's D-Bus policy is the access control: what this user may do is
 * learned by calling, never guessed from groups. An object that is not on the
 * bus (no systemd, no image service, an older service without a property)
 * gets a panel that says so, and lights up when it appears.
 *
 * Live: PropertiesChanged, RunStateChanged/RunFinished, SandboxesChanged,
 * Progress/Finished and NameOwnerChanged signals drive the page; a timer re-reads the units
 * and counts every 10 s, in case a signal was missed. Approvals have no
 * signal: their view, while shown, re-reads them every 4 s.
 *
 * Texts from chat platforms are untrusted: they only ever reach the page as
 * textContent, never as HTML.
 */
(function () {
    "use strict";

    const SCHED = { name: "dev.berth.Scheduler1", path: "/dev/berth/Scheduler1", iface: "dev.berth.Scheduler1" };
    const INTAKE = { name: "dev.berth.Intake1", path: "/dev/berth/Intake1", iface: "dev.berth.Intake1" };
    const IMAGES = { name: "dev.berth.Images1", path: "/dev/berth/Images1", iface: "dev.berth.Images1" };
    const SYSTEMD = { name: "org.freedesktop.systemd1", path: "/org/freedesktop/systemd1", iface: "org.freedesktop.systemd1.Manager" };
    const PROPS = "org.freedesktop.DBus.Properties";
    const REFRESH_MS = 10000; // the slowest safety net; signals do the rest
    const CALL_TIMEOUT_MS = 30000;

    const UNITS = [
        { unit: "berth-intake.socket", name: "" },
        { unit: "berth-intake.service", name: INTAKE.name },
        { unit: "berth-scheduler.service", name: SCHED.name },
        { unit: "berth-imaged.service", name: IMAGES.name },
    ];

    const ADMIN_HINT = "Only root and members of group berth-admin may do this (berth's D-Bus policy).";

    // superuser "try": a Cockpit user with administrative access acts as
    // root, anyone else as themselves; the policy decides either way.
    const busOptions = { bus: "system", superuser: "try" };
    const driver = cockpit.dbus("org.freedesktop.DBus", busOptions);
    const clients = {};
    function client(name) {
        if (!clients[name])
            clients[name] = cockpit.dbus(name, busOptions);
        return clients[name];
    }

    // What is on the bus: "running", "activatable" or "absent" per name.
    const presence = {};
    // What this user may do, learned by calling: true, false, or null (not yet known).
    const may = { cancel: null, images: null, sandboxes: null, schedules: null, approvals: null };
    const mayError = { cancel: null, images: null, sandboxes: null, schedules: null, approvals: null };

    const state = {
        sched: {}, // Scheduler1 properties
        intake: {}, // Intake1 properties
        images: {}, // Images1 properties
        units: {}, // unit -> {LoadState, ActiveState, SubState}
        systemd: null, // true, false or null
        runs: [], // the runs list as shown
        runsCursorDone: false,
        runsError: null,
        signalRuns: {}, // runs seen only through signals (when ListRuns is refused)
        agents: new Set(),
        explained: {}, // agent -> {json} or {error}
        images_list: null,
        sandboxes: null, // ListSandboxes as last read
        sandboxesError: null,
        schedules: null, // ListSchedules as last read
        schedulesError: null,
        usage: null, // Usage as last read: [{agent, day, usage}]
        usageDays: [],
        usageError: null,
        approvals: null, // ListApprovals("") as last read, newest first
        approvalsError: null,
        job: null, // {path, step, total, lines, tag, error, done}
    };

    // ---------- small DOM helpers (text only, never HTML) ----------

    function $(id) { return document.getElementById(id) }

    function h(tag, attrs, ...children) {
        const el = document.createElement(tag);
        for (const [k, v] of Object.entries(attrs || {})) {
            if (v === undefined || v === null || v === false)
                continue;
            if (k === "text")
                el.textContent = v;
            else if (k === "onclick")
                el.addEventListener("click", v);
            else if (k === "class")
                el.className = v;
            else
                el.setAttribute(k, v === true ? "" : v);
        }
        for (const c of children.flat(Infinity)) {
            if (c === undefined || c === null || c === false)
                continue;
            el.append(c instanceof Node ? c : document.createTextNode(String(c)));
        }
        return el;
    }

    function setText(id, text) {
        const el = $(id);
        if (el.textContent !== text)
            el.textContent = text;
    }

    function setCount(id, value) {
        const el = $(id);
        const text = value === undefined || value === null ? "—" : String(value);
        el.dataset.value = value === undefined || value === null ? "" : String(value);
        if (el.textContent !== text)
            el.textContent = text;
    }

    function showError(id, err, what) {
        const el = $(id);
        if (!err) {
            el.hidden = true;
            el.replaceChildren();
            return;
        }
        el.replaceChildren(errorBlock(err, what));
        el.hidden = false;
    }

    function errorBlock(err, what) {
        const name = err && err.name ? err.name : (err && err.problem) || "";
        let lead = what ? what + ": " : "";
        if (isRefusal(err))
            lead = (what ? what + " was refused" : "Refused") + " — " + ADMIN_HINT + " ";
        return h("div", { class: "berth-alert-title berth-error-text" },
            h("span", {}, lead),
            h("span", { class: "berth-error-message" }, errMessage(err)),
            name ? h("code", { class: "berth-error-name" }, name) : null);
    }

    function errMessage(err) {
        if (!err)
            return "";
        if (err.message)
            return err.message;
        return cockpit.message(err);
    }

    // A refusal is the bus's policy (org.freedesktop.DBus.Error.AccessDenied)
    // or berth's own re-check (dev.berth.Error.AccessDenied).
    function isRefusal(err) {
        return !!err && (err.name === "org.freedesktop.DBus.Error.AccessDenied" ||
            err.name === "dev.berth.Error.AccessDenied" || err.problem === "access-denied");
    }

    function isMissing(err) {
        return !!err && (err.name === "org.freedesktop.DBus.Error.ServiceUnknown" ||
            err.name === "org.freedesktop.DBus.Error.NameHasNoOwner" || err.problem === "not-found");
    }

    function isUnknownMethod(err) {
        return !!err && (err.name === "org.freedesktop.DBus.Error.UnknownMethod" ||
            err.name === "org.freedesktop.DBus.Error.UnknownInterface");
    }

    // cockpit.dbus gives variants as {t, v}; plain() unwraps them all.
    function plain(v) {
        if (Array.isArray(v))
            return v.map(plain);
        if (v && typeof v === "object") {
            const keys = Object.keys(v);
            if (keys.length === 2 && "t" in v && "v" in v && typeof v.t === "string")
                return plain(v.v);
            const out = {};
            for (const k of keys)
                out[k] = plain(v[k]);
            return out;
        }
        return v;
    }

    function call(name, path, iface, method, args, type) {
        const opts = { timeout: CALL_TIMEOUT_MS };
        if (type !== undefined)
            opts.type = type;
        return client(name).call(path, iface, method, args, opts);
    }

    function fmtTime(usec) {
        if (!usec)
            return "—";
        const d = new Date(Number(usec) / 1000);
        return d.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
    }

    function fmtISO(s) {
        if (!s)
            return "—";
        const d = new Date(s);
        return isNaN(d) ? s : d.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
    }

    function fmtDuration(ms) {
        if (ms === null || ms === undefined || ms < 0)
            return "—";
        if (ms < 1000)
            return ms.toFixed(0) + " ms";
        const s = ms / 1000;
        if (s < 60)
            return s.toFixed(1) + " s";
        const m = Math.floor(s / 60);
        if (m < 60)
            return m + " min " + Math.floor(s % 60) + " s";
        return Math.floor(m / 60) + " h " + (m % 60) + " min";
    }

    function fmtBytes(n) {
        if (n === undefined || n === null || n === "")
            return "—";
        n = Number(n);
        const units = ["B", "KiB", "MiB", "GiB", "TiB"];
        let i = 0;
        while (n >= 1024 && i < units.length - 1) {
            n /= 1024;
            i++;
        }
        return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + " " + units[i];
    }

    function runDuration(r) {
        const start = Number(r.started_usec || 0);
        if (!start)
            return null;
        const end = Number(r.finished_usec || 0) || Date.now() * 1000;
        return (end - start) / 1000;
    }

    function stateLabel(s) {
        return h("span", { class: "berth-state berth-state-" + (s || "unknown"), text: s || "unknown" });
    }

    // An admin action: enabled when the policy lets this user do it,
    // disabled with a tooltip (and a description for screen readers) when not.
    function adminButton(label, kind, permission, onclick, attrs) {
        const btn = h("button", { type: "button", class: "pf-c-button " + kind, ...(attrs || {}) }, label);
        const allowed = may[permission];
        if (allowed === true) {
            btn.addEventListener("click", onclick);
            return btn;
        }
        btn.disabled = true;
        btn.setAttribute("aria-disabled", "true");
        const hint = allowed === false ? ADMIN_HINT : "Checking whether you may do this…";
        btn.title = hint;
        btn.setAttribute("aria-label", label + " (" + (allowed === false ? "not permitted" : "checking") + ")");
        // A disabled button gets no pointer events in some browsers: the
        // wrapper carries the tooltip too.
        return h("span", { class: "berth-disabled-wrap", title: hint, "data-admin-disabled": permission }, btn);
    }

    // ---------- presence on the bus ----------

    let activatable = null;

    function refreshPresence() {
        const list = activatable ? Promise.resolve(activatable) :
            driver.call("/org/freedesktop/DBus", "org.freedesktop.DBus", "ListActivatableNames", [], { timeout: CALL_TIMEOUT_MS })
                .then(([names]) => { activatable = names; return names });
        return list.catch(() => []).then(names => {
            const all = [SCHED.name, INTAKE.name, IMAGES.name, SYSTEMD.name];
            return Promise.all(all.map(name =>
                driver.call("/org/freedesktop/DBus", "org.freedesktop.DBus", "NameHasOwner", [name], { timeout: CALL_TIMEOUT_MS })
                    .then(([has]) => {
                        presence[name] = has ? "running" : (names.includes(name) ? "activatable" : "absent");
                    })
                    .catch(() => { presence[name] = "absent" })));
        });
    }

    function presenceText(name, what) {
        switch (presence[name]) {
        case "running": return what + " is running.";
        case "activatable": return what + " is not running; it starts on demand.";
        case "absent": return what + " is not installed on this bus (" + name + ").";
        default: return "Looking for " + what + "…";
        }
    }

    // ---------- properties ----------

    function readProps(target, key) {
        if (presence[target.name] !== "running") {
            state[key] = {};
            return Promise.resolve();
        }
        return call(target.name, target.path, PROPS, "GetAll", [target.iface], "s")
            .then(([props]) => { state[key] = plain(props) })
            .catch(err => { state[key] = { _error: err } });
    }

    function onPropertiesChanged(key) {
        return (path, iface, signal, args) => {
            const [, changed] = args;
            Object.assign(state[key], plain(changed));
            renderOverview();
        };
    }

    // ---------- systemd ----------

    function refreshUnits() {
        if (presence[SYSTEMD.name] !== "running") {
            state.systemd = false;
            return Promise.resolve();
        }
        state.systemd = true;
        const sd = client(SYSTEMD.name);
        return Promise.all(UNITS.map(u =>
            sd.call(SYSTEMD.path, SYSTEMD.iface, "LoadUnit", [u.unit], { timeout: CALL_TIMEOUT_MS })
                .then(([path]) => sd.call(path, PROPS, "GetAll", ["org.freedesktop.systemd1.Unit"], { timeout: CALL_TIMEOUT_MS }))
                .then(([props]) => {
                    const p = plain(props);
                    state.units[u.unit] = { LoadState: p.LoadState, ActiveState: p.ActiveState, SubState: p.SubState };
                })
                .catch(err => { state.units[u.unit] = { error: err } })));
    }

    function unitText(u) {
        if (state.systemd === false)
            return "systemd not available";
        const s = state.units[u];
        if (!s)
            return "…";
        if (s.error)
            return errMessage(s.error);
        if (s.LoadState === "not-found")
            return "not installed";
        return s.ActiveState + (s.SubState && s.SubState !== s.ActiveState ? " (" + s.SubState + ")" : "");
    }

    // ---------- permissions, by calling ----------

    // CancelRun("") is the cheapest state-changing call: no run has an empty
    // id, so it changes nothing; the bus refuses it for users its policy does
    // not admit, and berth answers anyone else with NotFound/InvalidArgument.
    function probeCancel() {
        if (may.cancel !== null || presence[SCHED.name] === "absent")
            return Promise.resolve();
        return call(SCHED.name, SCHED.path, SCHED.iface, "CancelRun", [""], "s")
            .then(() => { may.cancel = true })
            .catch(err => {
                if (isRefusal(err)) {
                    may.cancel = false;
                    mayError.cancel = err;
                } else {
                    may.cancel = true;
                }
            });
    }

    // StopSandbox(""), RunSchedule("") and DecideApproval("", …) change
    // nothing either: no sandbox, job or approval has an empty id. An older
    // scheduler without the method leaves the permission unknown; its list
    // call says why.
    function probeScheduler(permission, method, args, type) {
        if (may[permission] !== null || presence[SCHED.name] === "absent")
            return Promise.resolve();
        return call(SCHED.name, SCHED.path, SCHED.iface, method, args || [""], type || "s")
            .then(() => { may[permission] = true })
            .catch(err => {
                if (isRefusal(err)) {
                    may[permission] = false;
                    mayError[permission] = err;
                } else if (!isUnknownMethod(err)) {
                    may[permission] = true;
                }
            });
    }

    // Remove("") on the image service: no image has an empty tag.
    function probeImages() {
        if (may.images !== null || !(presence[IMAGES.name] === "running" || presence[IMAGES.name] === "activatable"))
            return Promise.resolve();
        return call(IMAGES.name, IMAGES.path, IMAGES.iface, "Remove", [""], "s")
            .then(() => { may.images = true })
            .catch(err => {
                if (isRefusal(err)) {
                    may.images = false;
                    mayError.images = err;
                } else {
                    may.images = true;
                }
            });
    }

    function renderAccessNotice() {
        const el = $("access-notice");
        if (may.cancel !== false) {
            el.hidden = true;
            return;
        }
        el.replaceChildren(h("p", { class: "berth-alert-title" },
            "You are not a berth admin: you may watch, but not change anything. " + ADMIN_HINT),
        h("p", { class: "berth-muted" }, "The bus said: ", h("span", { id: "access-error" }, errMessage(mayError.cancel))));
        el.hidden = false;
    }

    // ---------- overview ----------

    function renderOverview() {
        setText("sched-presence", presenceText(SCHED.name, "berth-scheduler"));
        const s = state.sched;
        setCount("queue-depth", s.QueueDepth);
        setCount("running", s.Running);
        setCount("quarantined", s.Quarantined);

        setText("intake-presence", presenceText(INTAKE.name, "berth-intake"));
        const i = state.intake;
        setCount("inbox-pending", i.InboxPending);
        setCount("outbox-pending", i.OutboxPending);

        setText("images-presence", presence[IMAGES.name] === "absent"
            ? "Image service not installed (berth-imaged, " + IMAGES.name + ")."
            : presenceText(IMAGES.name, "berth-imaged"));
        setCount("image-count", state.images.ImageCount);
        setCount("image-building", state.images.Building);

        const notice = $("systemd-notice");
        if (state.systemd === false) {
            notice.textContent = "systemd not available on this system bus: unit states are unknown.";
            notice.hidden = false;
        } else {
            notice.hidden = true;
        }
        const rows = UNITS.map(u => h("tr", { "data-unit": u.unit },
            h("td", { "data-label": "Unit" }, h("code", {}, u.unit)),
            h("td", { "data-label": "systemd state", class: "berth-unit-state" }, unitText(u.unit)),
            h("td", { "data-label": "D-Bus name" }, u.name ? h("code", {}, u.name) : "—"),
            h("td", { "data-label": "On the bus" }, u.name ? (presence[u.name] || "…") : "—")));
        $("units-table").tBodies[0].replaceChildren(...rows);

        renderConnectors();
    }

    function renderConnectors() {
        const notice = $("connectors-notice");
        const table = $("connectors-table");
        const i = state.intake;
        if (presence[INTAKE.name] !== "running") {
            notice.textContent = "berth-intake is not running: connector states appear when it runs.";
            table.hidden = true;
            return;
        }
        if (i._error) {
            notice.replaceChildren(errorBlock(i._error, "Reading intake's properties"));
            table.hidden = true;
            return;
        }
        if (!("Connectors" in i)) {
            notice.textContent = "This berth-intake does not publish connector states.";
            table.hidden = true;
            return;
        }
        const list = i.Connectors || [];
        if (list.length === 0) {
            notice.textContent = "No connectors configured.";
            table.hidden = true;
            return;
        }
        notice.textContent = "";
        const rows = list.map(c => h("tr", { "data-connector": c.id },
            h("td", { "data-label": "Connector" }, h("code", {}, c.id)),
            h("td", { "data-label": "Type" }, c.type || "—"),
            h("td", { "data-label": "State" }, stateLabel(c.state)),
            h("td", { "data-label": "Connected since" }, fmtISO(c.connected_since)),
            h("td", { "data-label": "Last event" }, fmtISO(c.last_event)),
            h("td", { "data-label": "Reconnects" }, c.reconnects === undefined ? "—" : String(c.reconnects)),
            h("td", { "data-label": "Last error" }, lastError(c)),
            h("td", { "data-label": "Warning", class: c.warning ? "berth-warning" : "" }, c.warning || "—")));
        table.tBodies[0].replaceChildren(...rows);
        table.hidden = false;
    }

    // lastError is a connector's last error with when it happened: an error
    // of an hour ago reads differently from one of a second ago.
    function lastError(c) {
        if (!c.last_error)
            return "—";
        if (!c.last_error_at)
            return c.last_error;
        return [c.last_error, h("br"), h("time", { class: "berth-muted", datetime: c.last_error_at }, fmtISO(c.last_error_at))];
    }

    // ---------- runs ----------

    const PAGE = 50;
    let runsToken = 0;
    let runsTimer = null;

    function runsFilter(extra) {
        const f = {};
        const agent = $("filter-agent").value;
        const st = $("filter-state").value;
        if (agent)
            f.agent = cockpit.variant("s", agent);
        if (st)
            f.state = cockpit.variant("s", st);
        return Object.assign(f, extra || {});
    }

    // loadRuns reads the first page again (as many rows as are shown, so a
    // live refresh keeps what the user paged in).
    function loadRuns() {
        const token = ++runsToken;
        const limit = Math.min(Math.max(PAGE, state.runs.length), 500);
        return call(SCHED.name, SCHED.path, SCHED.iface, "ListRuns", [runsFilter({ limit: cockpit.variant("u", limit) })], "a{sv}")
            .then(([runs]) => {
                if (token !== runsToken)
                    return;
                state.runs = plain(runs);
                state.runsCursorDone = state.runs.length < limit;
                state.runsError = null;
                state.runs.forEach(r => noteAgent(r.agent));
                renderRuns();
            })
            .catch(err => {
                if (token !== runsToken)
                    return;
                state.runsError = err;
                renderRuns();
            });
    }

    function loadMoreRuns() {
        const last = state.runs[state.runs.length - 1];
        if (!last)
            return;
        const token = ++runsToken;
        call(SCHED.name, SCHED.path, SCHED.iface, "ListRuns",
            [runsFilter({ limit: cockpit.variant("u", PAGE), before: cockpit.variant("s", last.id) })], "a{sv}")
            .then(([runs]) => {
                if (token !== runsToken)
                    return;
                const more = plain(runs);
                state.runs = state.runs.concat(more);
                state.runsCursorDone = more.length < PAGE;
                renderRuns();
            })
            .catch(err => { state.runsError = err; renderRuns() });
    }

    // A signal about a run: refresh soon, coalescing bursts.
    function runsChanged() {
        if (runsTimer)
            return;
        runsTimer = window.setTimeout(() => {
            runsTimer = null;
            if (currentView === "runs")
                loadRuns();
        }, 200);
    }

    function noteAgent(agent) {
        if (!agent || state.agents.has(agent))
            return;
        state.agents.add(agent);
        const sorted = Array.from(state.agents).sort();
        const sel = $("filter-agent");
        const chosen = sel.value;
        sel.replaceChildren(h("option", { value: "" }, "All agents"), ...sorted.map(a => h("option", { value: a }, a)));
        sel.value = chosen;
        $("known-agents").replaceChildren(h("option", { value: "default" }), ...sorted.map(a => h("option", { value: a })));
        if (currentView === "agents")
            renderAgents();
    }

    function cancelRun(id, button) {
        button.disabled = true;
        call(SCHED.name, SCHED.path, SCHED.iface, "CancelRun", [id], "s")
            .then(() => {
                runsChanged();
                if (shownRun === id)
                    loadRun(id);
            })
            .catch(err => {
                button.disabled = false;
                const target = currentView === "run" ? "run-error" : "runs-error";
                showError(target, err, "Canceling run " + id);
            });
    }

    function runRow(r, fromSignals) {
        const active = r.state === "queued" || r.state === "running";
        const actions = active
            ? adminButton("Cancel", "pf-m-secondary pf-m-small", "cancel", ev => cancelRun(r.id, ev.currentTarget), { "data-cancel": r.id })
            : "";
        return h("tr", { "data-run-id": r.id, "data-state": r.state },
            h("th", { scope: "row", "data-label": "Run" }, h("a", { href: "#/runs/" + encodeURIComponent(r.id) }, h("code", {}, r.id))),
            h("td", { "data-label": "Agent" }, r.agent || "—",
                r.schedule ? h("div", { class: "berth-reason", "data-schedule": r.schedule }, "schedule " + r.schedule) : null),
            h("td", { "data-label": "State", class: "berth-run-state" }, stateLabel(r.state), r.reason ? h("span", { class: "berth-reason" }, " " + r.reason) : null),
            h("td", { "data-label": "Created" }, fromSignals ? fmtTime(r.seen_usec) : fmtTime(r.created_usec)),
            h("td", { "data-label": "Duration" }, fromSignals ? "—" : fmtDuration(runDuration(r))),
            h("td", { "data-label": "Message", class: "berth-preview" }, fromSignals ? h("span", { class: "berth-muted" }, "hidden") : (r.text_preview || "")),
            h("td", { "data-label": "Reply", class: "berth-preview" }, fromSignals ? h("span", { class: "berth-muted" }, "hidden") : (r.reply_preview || "")),
            h("td", { class: "berth-actions" }, actions));
    }

    function renderRuns() {
        const tbody = $("runs-table").tBodies[0];
        const err = state.runsError;
        let rows;
        let fromSignals = false;
        if (err && isRefusal(err)) {
            // Signals reach every client: show what they say (no texts).
            fromSignals = true;
            const agent = $("filter-agent").value;
            const st = $("filter-state").value;
            rows = Object.values(state.signalRuns)
                .filter(r => (!agent || r.agent === agent) && (!st || r.state === st))
                .sort((a, b) => b.seen_usec - a.seen_usec);
            showError("runs-error", err, "Listing runs");
            setText("runs-live", "Showing runs seen live since this page opened; their texts are for admins only.");
        } else {
            rows = state.runs;
            showError("runs-error", err, "Listing runs");
            setText("runs-live", err ? "" : "Live: runs update as they change.");
        }
        tbody.replaceChildren(...rows.map(r => runRow(r, fromSignals)));
        $("runs-empty").hidden = rows.length > 0 || (err && !fromSignals);
        $("runs-more").hidden = fromSignals || !!err || state.runsCursorDone || rows.length === 0;
    }

    function onSchedulerSignal(path, iface, signal, args) {
        if (signal === "SandboxesChanged") {
            sandboxesChanged();
            return;
        }
        if (signal === "RunStateChanged" || signal === "RunFinished") {
            onRunSignal(path, iface, signal, args);
            schedulesChanged();
            approvalsChanged();
        }
    }

    function onRunSignal(path, iface, signal, args) {
        const [id, agent, st, reason] = args;
        const seen = state.signalRuns[id] || { id, seen_usec: Date.now() * 1000 };
        seen.agent = agent;
        seen.state = st;
        if (signal === "RunFinished")
            seen.reason = reason;
        state.signalRuns[id] = seen;
        noteAgent(agent);
        if (currentView === "runs") {
            if (state.runsError && isRefusal(state.runsError))
                renderRuns();
            else
                runsChanged();
        }
        if (shownRun === id)
            loadRun(id);
    }

    // ---------- one run ----------

    let shownRun = null;
    let runToken = 0;

    function loadRun(id) {
        const token = ++runToken;
        setText("run-title", "Run " + id);
        return call(SCHED.name, SCHED.path, SCHED.iface, "GetRun", [id], "s")
            .then(([run]) => {
                if (token !== runToken)
                    return;
                const r = plain(run);
                showError("run-error", null);
                return fullTexts(r).then(() => { if (token === runToken) renderRun(r) });
            })
            .catch(err => {
                if (token !== runToken)
                    return;
                $("run-body").hidden = true;
                showError("run-error", err, "Reading run " + id);
            });
    }

    // GetRun cuts long texts; read the whole of each that was cut.
    function fullTexts(r) {
        const whats = { text: "text", reply: "reply", tool_calls: "tool_calls", stderr_tail: "stderr" };
        return Promise.all(Object.entries(whats).filter(([key]) => r[key + "_cut"]).map(([key, what]) =>
            readOutput(r.id, what).then(full => { r[key] = full; r[key + "_cut"] = false }).catch(() => {})));
    }

    function readOutput(id, what) {
        let out = "";
        const page = offset => call(SCHED.name, SCHED.path, SCHED.iface, "GetRunOutput", [id, what, offset], "sst")
            .then(([chunk, next]) => {
                out += chunk;
                return next ? page(next) : out;
            });
        return page(0);
    }

    function renderRun(r) {
        $("run-body").hidden = false;
        const active = r.state === "queued" || r.state === "running";
        $("run-actions").replaceChildren(active
            ? adminButton("Cancel run", "pf-m-danger", "cancel", ev => cancelRun(r.id, ev.currentTarget), { id: "run-cancel" })
            : "");
        const created = Number(r.created_usec || 0);
        const started = Number(r.started_usec || 0);
        const fields = [
            ["State", stateLabel(r.state)],
            ["Reason", r.reason || "—"],
            ["Agent", r.agent],
            ["Backend", r.backend || "—"],
            ["Connector", r.connector || "—"],
            ["Channel", [r.channel, r.thread ? " (thread " + r.thread + ")" : ""].join("") || "—"],
            ["Author", r.author || "—"],
            ["Message id", r.message_id],
            ["Attempts", String(r.attempts ?? "—")],
            ["Created", fmtTime(r.created_usec)],
            ["Started", fmtTime(r.started_usec)],
            ["Finished", fmtTime(r.finished_usec)],
            ["Waited in queue", started && created ? fmtDuration((started - created) / 1000) : "—"],
            ["Ran for", fmtDuration(runDuration(r))],
            ["Reply delivered", r.delivered ? "yes" : "no"],
        ];
        $("run-fields").replaceChildren(...fields.map(([k, v]) =>
            h("div", { "data-field": k }, h("dt", {}, k), h("dd", {}, v))));
        $("run-text").textContent = r.text || "";
        $("run-reply").textContent = r.reply || (active ? "(no reply yet)" : "(no reply)");
        $("run-error-text-block").hidden = !r.error;
        $("run-error-text").textContent = r.error || "";
        renderToolCalls(r.tool_calls);
        renderEgress(r.egress, r.egress_dropped);
        $("run-stderr").textContent = r.stderr_tail || "(empty)";
    }

    function renderToolCalls(json) {
        let calls = [];
        try {
            calls = JSON.parse(json || "[]") || [];
        } catch (e) {
            calls = [{ name: "(unreadable)", output: String(json) }];
        }
        const table = $("run-tools");
        $("run-tools-empty").hidden = calls.length > 0;
        table.hidden = calls.length === 0;
        table.tBodies[0].replaceChildren(...calls.map((c, i) => h("tr", {},
            h("td", { "data-label": "#" }, String(i + 1)),
            h("th", { scope: "row", "data-label": "Tool" }, h("code", {}, c.name || "?")),
            h("td", { "data-label": "Arguments" }, h("pre", { class: "berth-pre berth-small" }, prettyJSON(c.args))),
            h("td", { "data-label": "Output" }, h("pre", { class: "berth-pre berth-small" }, c.output || "")),
            h("td", { "data-label": "Error" }, c.error || ""))));
    }

    // renderEgress shows the egress proxy's decisions of a run (GetRun's
    // egress JSON), each with its rule or the reason it was refused.
    function renderEgress(json, dropped) {
        let decisions = [];
        try {
            decisions = JSON.parse(json || "[]") || [];
        } catch (e) {
            decisions = [];
        }
        const table = $("run-egress");
        $("run-egress-empty").hidden = decisions.length > 0;
        table.hidden = decisions.length === 0;
        table.tBodies[0].replaceChildren(...decisions.map(d => h("tr", {},
            h("td", { "data-label": "Time" }, d.time ? new Date(d.time).toLocaleTimeString() : ""),
            h("th", { scope: "row", "data-label": "Request" }, h("code", {}, (d.method || "") + " " + (d.host || "") + ":" + (d.port || "") + (d.path ? " " + d.path : ""))),
            h("td", { "data-label": "Decision", class: d.allowed ? "" : "berth-refused" }, d.allowed ? "allowed" : "refused"),
            h("td", { "data-label": "Rule or reason" }, (d.allowed ? d.rule : d.reason) || ""),
            h("td", { "data-label": "Bytes up / down" }, String(d.bytes_up || 0) + " / " + String(d.bytes_down || 0)))));
        const more = Number(dropped || 0);
        $("run-egress-dropped").hidden = more === 0;
        $("run-egress-dropped").textContent = more ? more + " more decisions were not kept." : "";
    }

    function prettyJSON(v) {
        if (v === undefined || v === null)
            return "";
        if (typeof v === "string") {
            try {
                return JSON.stringify(JSON.parse(v), null, 2);
            } catch (e) {
                return v;
            }
        }
        return JSON.stringify(v, null, 2);
    }

    // ---------- agents ----------

    function explain(agent) {
        state.explained[agent] = { loading: true };
        renderAgents();
        return call(SCHED.name, SCHED.path, SCHED.iface, "ExplainAgent", [agent], "s")
            .then(([json]) => {
                let parsed;
                try {
                    parsed = JSON.parse(json);
                } catch (e) {
                    parsed = null;
                }
                state.explained[agent] = { json, parsed };
                noteAgent(agent);
            })
            .catch(err => { state.explained[agent] = { error: err } })
            .then(renderAgents);
    }

    function renderAgents() {
        const agents = Array.from(new Set([...state.agents, ...Object.keys(state.explained)])).sort();
        const list = $("agents-list");
        if (agents.length === 0) {
            list.replaceChildren(h("p", { class: "berth-muted" }, "No agents seen yet: type an agent id above."));
            return;
        }
        list.replaceChildren(...agents.map(agent => {
            const e = state.explained[agent];
            const body = [];
            if (!e) {
                body.push(h("button", { type: "button", class: "pf-c-button pf-m-secondary", onclick: () => explain(agent) }, "Explain " + agent));
            } else if (e.loading) {
                body.push(h("p", { class: "berth-muted" }, "Asking the scheduler…"));
            } else if (e.error) {
                if (isUnknownMethod(e.error))
                    body.push(h("p", { class: "berth-muted" }, "This berth-scheduler cannot explain agents yet (no ExplainAgent)."));
                else
                    body.push(h("div", { class: "berth-alert berth-alert-danger berth-error", role: "alert" }, errorBlock(e.error, "Explaining " + agent)));
            } else {
                body.push(renderExplanation(e.parsed, e.json));
            }
            return h("article", { class: "pf-c-card berth-card", "data-agent": agent, "aria-labelledby": "agent-" + agent },
                h("div", { class: "pf-c-card__title" }, h("h3", { class: "pf-c-title pf-m-lg", id: "agent-" + agent }, agent)),
                h("div", { class: "pf-c-card__body" }, body));
        }));
    }

    const DURATION_KEYS = new Set(["timeout", "kill_grace"]);

    function renderExplanation(e, json) {
        if (!e)
            return h("pre", { class: "berth-pre" }, json);
        const plan = e.plan || {};
        const out = [];
        const summary = [
            ["Backend", (plan.backend || "?") + (e.backend_available === false ? " (not available in this scheduler)" : "")],
            ["Runs as", plan.run_as || "—"],
            ["Workspace", plan.workspace || "—"],
            ["Timeout", plan.timeout ? fmtDuration(plan.timeout / 1e6) : "—"],
        ];
        out.push(h("dl", { class: "berth-fields" }, summary.map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v)))));
        if (e.problems && e.problems.length)
            out.push(h("div", { class: "berth-alert berth-alert-warning", role: "alert" },
                h("p", { class: "berth-alert-title" }, "A run would fail:"),
                h("ul", {}, e.problems.map(p => h("li", {}, p)))));
        if (e.why && Object.keys(e.why).length)
            out.push(h("table", { class: "pf-c-table pf-m-compact berth-why" },
                h("caption", {}, "Why"),
                h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Decision"), h("th", { scope: "col" }, "Because"))),
                h("tbody", {}, Object.entries(e.why).sort().map(([k, v]) => h("tr", {}, h("th", { scope: "row" }, k), h("td", {}, v))))));
        const rest = Object.assign({}, e);
        delete rest.why;
        delete rest.problems;
        out.push(h("details", {}, h("summary", {}, "The whole plan"), tree(rest)));
        out.push(h("details", {}, h("summary", {}, "JSON"), h("pre", { class: "berth-pre berth-small" }, JSON.stringify(e, null, 2))));
        return out;
    }

    // tree renders any JSON value as nested definition lists.
    function tree(v, key) {
        if (v === null || v === undefined || v === "")
            return h("span", { class: "berth-muted" }, "—");
        if (typeof v === "number" && key && DURATION_KEYS.has(key))
            return document.createTextNode(fmtDuration(v / 1e6));
        if (typeof v !== "object")
            return document.createTextNode(String(v));
        if (Array.isArray(v)) {
            if (v.length === 0)
                return h("span", { class: "berth-muted" }, "none");
            if (v.every(x => typeof x !== "object"))
                return document.createTextNode(v.join(", "));
            return h("ol", { class: "berth-tree-list" }, v.map(x => h("li", {}, tree(x))));
        }
        const keys = Object.keys(v);
        if (keys.length === 0)
            return h("span", { class: "berth-muted" }, "—");
        return h("dl", { class: "berth-tree" }, keys.map(k => h("div", {}, h("dt", {}, k), h("dd", {}, tree(v[k], k)))));
    }

    // ---------- images ----------

    function imagesAvailable() {
        return presence[IMAGES.name] === "running" || presence[IMAGES.name] === "activatable";
    }

    function loadImages() {
        if (!imagesAvailable()) {
            renderImages();
            return Promise.resolve();
        }
        return call(IMAGES.name, IMAGES.path, IMAGES.iface, "ListImages", [], "")
            .then(([list]) => {
                state.images_list = plain(list);
                state.images_error = null;
                state.images_list.forEach(img => (img.agents || []).forEach(noteAgent));
            })
            .catch(err => { state.images_error = err })
            .then(renderImages);
    }

    function renderImages() {
        const notice = $("images-notice");
        const body = $("images-body");
        if (!imagesAvailable()) {
            notice.textContent = presence[IMAGES.name] === "absent"
                ? "Image service not installed: berth-imaged (" + IMAGES.name + ") is not on this bus."
                : "Looking for the image service…";
            body.hidden = true;
            showError("images-error", null);
            return;
        }
        notice.textContent = presenceText(IMAGES.name, "berth-imaged");
        body.hidden = false;
        showError("images-error", state.images_error, "Listing images");
        const list = state.images_list || [];
        $("images-empty").hidden = list.length > 0;
        $("images-table").tBodies[0].replaceChildren(...list.map(img => {
            const usedBy = img.agents || [];
            return h("tr", { "data-tag": img.tag, "data-status": img.status || "" },
                h("th", { scope: "row", "data-label": "Tag" }, h("code", {}, img.tag)),
                h("td", { "data-label": "Kind" }, img.kind || "—"),
                h("td", { "data-label": "Status" }, stateLabel(img.status), img.error ? h("div", { class: "berth-reason" }, img.error) : null),
                h("td", { "data-label": "Size" }, img.present ? fmtBytes(img.size) : "—"),
                h("td", { "data-label": "Created" }, fmtISO(img.created)),
                h("td", { "data-label": "Last used" }, img.last_used ? fmtISO(img.last_used) : "never"),
                h("td", { "data-label": "Used by" }, usedBy.length ? usedBy.join(", ") : "—"),
                h("td", { "data-label": "Present" }, img.present ? "present" : h("span", { class: "berth-warning" }, "missing")),
                h("td", { class: "berth-actions" }, adminButton("Remove", "pf-m-secondary pf-m-small", "images", ev => removeImage(img.tag, ev.currentTarget), { "data-remove": img.tag })));
        }));
        for (const [id, all] of [["images-clean", false], ["images-clean-all", true]])
            gate($(id), "images", () => cleanImages(all));
        gate($("build-button"), "images", null);
    }

    // gate enables or disables a static admin button by what the policy said.
    function gate(btn, permission, onclick) {
        const allowed = may[permission];
        btn.disabled = allowed !== true;
        if (allowed === true) {
            btn.removeAttribute("title");
            btn.removeAttribute("aria-disabled");
        } else {
            btn.title = allowed === false ? ADMIN_HINT : "Checking whether you may do this…";
            btn.setAttribute("aria-disabled", "true");
        }
        if (onclick && !btn.dataset.bound) {
            btn.dataset.bound = "1";
            btn.addEventListener("click", () => { if (may[permission] === true) onclick() });
        }
    }

    function removeImage(tag, button) {
        button.disabled = true;
        call(IMAGES.name, IMAGES.path, IMAGES.iface, "Remove", [tag], "s")
            .then(() => {
                showError("images-error", null);
                setText("images-done", "Removed " + tag + ".");
            })
            .catch(err => { button.disabled = false; showError("images-error", err, "Removing " + tag) })
            .then(loadImages);
    }

    function cleanImages(all) {
        call(IMAGES.name, IMAGES.path, IMAGES.iface, "Clean", [all], "b")
            .then(([removed]) => {
                showError("images-error", null);
                setText("images-done", removed.length ? "Removed " + removed.join(", ") + "." : "Nothing to remove.");
            })
            .catch(err => showError("images-error", err, all ? "Cleaning all images" : "Cleaning unused images"))
            .then(loadImages);
    }

    function previewDockerfile() {
        const target = $("build-target").value.trim() || "default";
        const pre = $("dockerfile");
        call(IMAGES.name, IMAGES.path, IMAGES.iface, "Dockerfile", [target], "s")
            .then(([text]) => {
                showError("images-error", null);
                pre.textContent = text;
                pre.hidden = false;
            })
            .catch(err => { pre.hidden = true; showError("images-error", err, "Dockerfile of " + target) });
    }

    function startBuild(ev) {
        ev.preventDefault();
        if (may.images !== true)
            return;
        const target = $("build-target").value.trim() || "default";
        const opts = { target: cockpit.variant("s", target) };
        if ($("build-no-cache").checked)
            opts.no_cache = cockpit.variant("b", true);
        state.job = { path: null, target, step: 0, total: 0, lines: [], done: false };
        renderJob();
        call(IMAGES.name, IMAGES.path, IMAGES.iface, "Build", [opts], "a{sv}")
            .then(([job]) => {
                state.job.path = job;
                renderJob();
            })
            .catch(err => {
                state.job = null;
                renderJob();
                showError("images-error", err, "Building " + target);
            });
    }

    function onImagesSignal(path, iface, signal, args) {
        const job = state.job;
        if (signal === "Progress") {
            const [jobPath, step, total, line] = args;
            if (!job || (job.path && job.path !== jobPath))
                return;
            job.path = jobPath;
            job.step = step;
            job.total = total;
            if (line)
                job.lines.push(line);
            if (job.lines.length > 500)
                job.lines.splice(0, job.lines.length - 500);
            renderJob();
        } else if (signal === "Finished") {
            const [jobPath, tag, error] = args;
            if (job && (!job.path || job.path === jobPath)) {
                job.done = true;
                job.tag = tag;
                job.error = error;
                if (!error)
                    job.step = job.total;
                renderJob();
            }
            loadImages();
        }
    }

    function renderJob() {
        const job = state.job;
        const status = $("build-status");
        const bar = $("build-progress");
        const log = $("build-log");
        if (!job) {
            status.textContent = "";
            bar.hidden = true;
            return;
        }
        bar.hidden = false;
        bar.max = Math.max(job.total, 1);
        bar.value = Math.min(job.step, bar.max);
        if (job.done)
            status.textContent = job.error ? "Build of " + job.target + " failed: " + job.error : "Built " + job.tag;
        else
            status.textContent = "Building " + job.target + (job.total ? ": step " + job.step + " of " + job.total : "…");
        log.hidden = job.lines.length === 0;
        log.textContent = job.lines.join("\n");
        log.scrollTop = log.scrollHeight;
    }

    // ---------- conversation sandboxes ----------

    // SandboxesChanged carries nothing: list again, coalescing bursts.
    let sandboxesTimer = null;
    function sandboxesChanged() {
        if (sandboxesTimer)
            return;
        sandboxesTimer = window.setTimeout(() => {
            sandboxesTimer = null;
            if (currentView === "sandboxes")
                loadSandboxes();
        }, 200);
    }

    let sandboxesToken = 0;
    function loadSandboxes() {
        const token = ++sandboxesToken;
        return call(SCHED.name, SCHED.path, SCHED.iface, "ListSandboxes", [""], "s")
            .then(([list]) => {
                if (token !== sandboxesToken)
                    return;
                state.sandboxes = plain(list);
                state.sandboxesError = null;
                state.sandboxes.forEach(sb => noteAgent(sb.agent));
            })
            .catch(err => {
                if (token !== sandboxesToken)
                    return;
                state.sandboxes = null;
                state.sandboxesError = err;
            })
            .then(() => { if (token === sandboxesToken) renderSandboxes() });
    }

    function verbatim(text) {
        return text ? h("code", { class: "berth-verbatim" }, text) : h("span", { class: "berth-muted" }, "—");
    }

    function sandboxRow(sb) {
        const memory = Number(sb.memory_bytes);
        return h("tr", { "data-sandbox-id": sb.id, "data-busy": sb.busy ? "true" : "false" },
            h("th", { scope: "row", "data-label": "Sandbox" }, h("code", {}, sb.id)),
            h("td", { "data-label": "Agent" }, sb.agent || "—"),
            h("td", { "data-label": "Connector" }, verbatim(sb.connector)),
            h("td", { "data-label": "Channel" }, verbatim(sb.channel)),
            h("td", { "data-label": "Thread" }, verbatim(sb.thread)),
            h("td", { "data-label": "Backend" }, sb.backend || "—"),
            h("td", { "data-label": "Started" }, fmtTime(sb.started_usec)),
            h("td", { "data-label": "Last activity" }, fmtTime(sb.last_activity_usec)),
            h("td", { "data-label": "Idle for" }, sb.busy ? stateLabel("running") : fmtDuration(Number(sb.idle_usec || 0) / 1000)),
            h("td", { "data-label": "Runs" }, String(sb.runs ?? "—")),
            h("td", { "data-label": "Memory" }, memory >= 0 ? fmtBytes(memory)
                : h("span", { class: "berth-muted", title: sb.memory_unknown || "" }, "unknown")),
            h("td", { class: "berth-actions" }, adminButton("Stop", "pf-m-secondary pf-m-small", "sandboxes",
                ev => stopSandbox(sb.id, ev.currentTarget), { "data-stop": sb.id })));
    }

    function renderSandboxes() {
        const err = state.sandboxesError;
        if (err && isUnknownMethod(err))
            showError("sandboxes-error", { message: "This berth-scheduler does not keep conversation sandboxes (no ListSandboxes)." });
        else
            showError("sandboxes-error", err, "Listing sandboxes");
        const list = state.sandboxes || [];
        $("sandboxes-table").tBodies[0].replaceChildren(...list.map(sandboxRow));
        $("sandboxes-table").hidden = !!err;
        $("sandboxes-empty").hidden = !!err || state.sandboxes === null || list.length > 0;
        setText("sandboxes-live", err ? "" : "Live: sandboxes update as they start, run and stop.");
    }

    function stopSandbox(id, button) {
        button.disabled = true;
        call(SCHED.name, SCHED.path, SCHED.iface, "StopSandbox", [id], "s")
            .then(() => {
                showError("sandboxes-error", null);
                setText("sandboxes-done", "Stopped " + id + ".");
            })
            .catch(err => {
                button.disabled = false;
                showError("sandboxes-error", err, "Stopping " + id);
            })
            .then(loadSandboxes);
    }

    // ---------- scheduled jobs ----------

    // A job's firing is a run: its run signals say when its last state may
    // have changed. The scheduler records a firing's end just after its
    // run's RunFinished, so a job still shown running is read once more a
    // second later (once per signal, not a loop).
    let schedulesTimer = null;
    function schedulesChanged() {
        if (schedulesTimer)
            return;
        schedulesTimer = window.setTimeout(() => {
            schedulesTimer = null;
            if (currentView !== "schedules")
                return;
            loadSchedules().then(() => {
                if ((state.schedules || []).some(sc => sc.running))
                    window.setTimeout(() => { if (currentView === "schedules") loadSchedules() }, 1000);
            });
        }, 200);
    }

    let schedulesToken = 0;
    function loadSchedules() {
        const token = ++schedulesToken;
        return call(SCHED.name, SCHED.path, SCHED.iface, "ListSchedules", [], "")
            .then(([list]) => {
                if (token !== schedulesToken)
                    return;
                state.schedules = plain(list);
                state.schedulesError = null;
                state.schedules.forEach(sc => noteAgent(sc.agent));
            })
            .catch(err => {
                if (token !== schedulesToken)
                    return;
                state.schedules = null;
                state.schedulesError = err;
            })
            .then(() => { if (token === schedulesToken) renderSchedules() });
    }

    function destination(sc) {
        const parts = [h("code", {}, sc.connector || "?"), " / ", h("code", { class: "berth-verbatim" }, sc.channel || "?")];
        if (sc.thread)
            parts.push(" / ", h("code", { class: "berth-verbatim" }, sc.thread));
        return parts;
    }

    function scheduleRow(sc) {
        const last = Number(sc.last_start_usec || 0);
        const lastState = sc.running ? "running" : sc.last_state;
        return h("tr", { "data-schedule-id": sc.id, "data-last-state": lastState || "" },
            h("th", { scope: "row", "data-label": "Schedule" }, h("code", {}, sc.id)),
            h("td", { "data-label": "Agent" }, sc.agent || "—"),
            h("td", { "data-label": "Calendar" }, h("code", {}, sc.on_calendar || "—")),
            h("td", { "data-label": "Destination" }, destination(sc)),
            h("td", { "data-label": "Next run" }, Number(sc.next_usec || 0) ? fmtTime(sc.next_usec) : "never again"),
            h("td", { "data-label": "Last run" }, last ? fmtTime(last) : "never"),
            h("td", { "data-label": "Last state" }, lastState ? stateLabel(lastState) : h("span", { class: "berth-muted" }, "—"),
                sc.last_detail ? h("div", { class: "berth-reason" }, sc.last_detail) : null),
            h("td", { class: "berth-actions" }, adminButton("Run now", "pf-m-secondary pf-m-small", "schedules",
                ev => runSchedule(sc.id, ev.currentTarget), { "data-run-schedule": sc.id })));
    }

    function renderSchedules() {
        const err = state.schedulesError;
        if (err && isUnknownMethod(err))
            showError("schedules-error", { message: "This berth-scheduler has no scheduled jobs (no ListSchedules)." });
        else
            showError("schedules-error", err, "Listing schedules");
        const list = state.schedules || [];
        $("schedules-table").tBodies[0].replaceChildren(...list.map(scheduleRow));
        $("schedules-table").hidden = !!err;
        $("schedules-empty").hidden = !!err || state.schedules === null || list.length > 0;
    }

    function runSchedule(id, button) {
        button.disabled = true;
        call(SCHED.name, SCHED.path, SCHED.iface, "RunSchedule", [id], "s")
            .then(([outcome]) => {
                showError("schedules-error", null);
                setText("schedules-done", "Run now of " + id + ": " + outcome + ".");
            })
            .catch(err => {
                button.disabled = false;
                showError("schedules-error", err, "Running " + id);
            })
            .then(loadSchedules);
    }

    // ---------- approvals: requests held for a person to decide ----------

    // ListApprovals (root and berth-admin) is every request a run's egress
    // proxy holds or held because an [agents.egress] ask rule matched,
    // newest first; DecideApproval answers a pending one, and the scheduler
    // names the caller as the decider. The scheduler signals no change of
    // an approval: while the view is shown it is re-read every few seconds,
    // and at once after a decision or a run's change of state (a run that
    // ends closes its approvals).
    const APPROVALS_POLL_MS = 4000;
    const APPROVALS_DECIDED_SHOWN = 50;
    const DECISIONS = [
        { decision: "allow_once", label: "Allow once", kind: "pf-m-primary", done: "allowed once" },
        { decision: "allow_standing", label: "Allow (standing)", kind: "pf-m-secondary", done: "allowed for the rest of its run's sandbox" },
        { decision: "allow_conversation", label: "Allow for this conversation", kind: "pf-m-secondary", done: "allowed for its conversation, later runs too" },
        { decision: "deny", label: "Deny", kind: "pf-m-danger", done: "denied" },
    ];

    function pollApprovals() {
        if (currentView === "approvals" && !document.hidden)
            loadApprovals();
    }

    let approvalsTimer = null;
    function approvalsChanged() {
        if (approvalsTimer)
            return;
        approvalsTimer = window.setTimeout(() => {
            approvalsTimer = null;
            if (currentView === "approvals")
                loadApprovals();
        }, 200);
    }

    let approvalsToken = 0;
    function loadApprovals() {
        const token = ++approvalsToken;
        return call(SCHED.name, SCHED.path, SCHED.iface, "ListApprovals", [""], "s")
            .then(([list]) => {
                if (token !== approvalsToken)
                    return;
                state.approvals = plain(list);
                state.approvalsError = null;
                state.approvals.forEach(ap => noteAgent(ap.agent));
            })
            .catch(err => {
                if (token !== approvalsToken)
                    return;
                state.approvals = null;
                state.approvalsError = err;
            })
            .then(() => { if (token === approvalsToken) renderApprovals() });
    }

    function conversation(ap) {
        if (!ap.connector && !ap.channel)
            return h("span", { class: "berth-muted" }, "—");
        const parts = [h("code", {}, ap.connector || "?"), " / ", h("code", { class: "berth-verbatim" }, ap.channel || "?")];
        if (ap.thread)
            parts.push(" / ", h("code", { class: "berth-verbatim" }, ap.thread));
        return parts;
    }

    // deadline is when an unanswered approval is denied, and for a pending
    // one how long is left.
    function deadline(ap) {
        const usec = Number(ap.deadline_usec || 0);
        if (!usec || ap.state !== "pending")
            return fmtTime(usec);
        const left = usec / 1000 - Date.now();
        return [fmtTime(usec), h("div", { class: "berth-reason" }, left > 0 ? "in " + fmtDuration(left) : "now")];
    }

    function approvalRow(ap) {
        const pending = ap.state === "pending";
        const decided = Number(ap.decided_at_usec || 0);
        return h("tr", { "data-approval-id": ap.id, "data-state": ap.state },
            h("th", { scope: "row", "data-label": "Approval", class: "berth-approval-id" }, h("code", {}, ap.id),
                ap.run_id ? h("div", {}, h("a", { href: "#/runs/" + encodeURIComponent(ap.run_id), title: "run " + ap.run_id, "data-run": ap.run_id }, "its run")) : null),
            h("td", { "data-label": "Agent" }, ap.agent || "—"),
            h("td", { "data-label": "Request" }, h("code", { class: "berth-verbatim" }, ap.what || "?")),
            h("td", { "data-label": "Rule" }, h("code", {}, ap.rule || "?")),
            h("td", { "data-label": "Conversation" }, conversation(ap)),
            h("td", { "data-label": "Asked" }, fmtTime(ap.asked_at_usec)),
            h("td", { "data-label": "Deadline" }, deadline(ap)),
            h("td", { "data-label": "State" }, stateLabel(ap.state), ap.conversation ? h("span", { class: "berth-reason" }, " for the conversation") : ap.standing ? h("span", { class: "berth-reason" }, " standing") : null),
            h("td", { "data-label": "Decided by" }, ap.by || (pending ? "" : "—"),
                decided ? h("div", { class: "berth-reason" }, fmtTime(decided)) : null),
            h("td", { class: "berth-actions" }, pending
                ? h("div", { class: "berth-decide" }, DECISIONS.map(d => adminButton(d.label, d.kind + " pf-m-small", "approvals",
                    ev => decideApproval(ap.id, d, ev.currentTarget), { "data-decide": d.decision })))
                : ""));
    }

    function renderApprovals() {
        const err = state.approvalsError;
        if (err && isUnknownMethod(err))
            showError("approvals-error", { message: "This berth-scheduler holds no requests for approval (no ListApprovals)." });
        else
            showError("approvals-error", err, "Listing approvals");
        const list = state.approvals || [];
        const pending = list.filter(ap => ap.state === "pending");
        const decided = list.filter(ap => ap.state !== "pending").slice(0, APPROVALS_DECIDED_SHOWN);
        // The poll redraws the rows: a decision button that had the focus keeps it.
        const focused = document.activeElement && document.activeElement.closest("#view-approvals tr[data-approval-id] button[data-decide]");
        const focusedAt = focused ? [focused.closest("tr").dataset.approvalId, focused.dataset.decide] : null;
        $("approvals-pending").tBodies[0].replaceChildren(...pending.map(approvalRow));
        $("approvals-decided").tBodies[0].replaceChildren(...decided.map(approvalRow));
        if (focusedAt) {
            const again = document.querySelector("#approvals-pending tr[data-approval-id=" + JSON.stringify(focusedAt[0]) + "] button[data-decide=" + JSON.stringify(focusedAt[1]) + "]");
            if (again)
                again.focus();
        }
        const shown = !err && state.approvals !== null;
        $("approvals-pending").hidden = !shown || pending.length === 0;
        $("approvals-decided").hidden = !shown || decided.length === 0;
        $("approvals-pending-empty").hidden = !shown || pending.length > 0;
        $("approvals-decided-empty").hidden = !shown || decided.length > 0;
        setText("approvals-live", shown ? "Live: re-read every " + APPROVALS_POLL_MS / 1000 + " s while shown." : "");
        document.getElementById("view-approvals").dataset.loaded = state.approvals === null && !err ? "false" : "true";
    }

    // decideApproval answers one approval; a refusal (decided meanwhile,
    // its run gone, not an admin) shows berth's error. Either way the list
    // is read again.
    function decideApproval(id, d, button) {
        const buttons = button.closest("tr") ? [...button.closest("tr").querySelectorAll("button[data-decide]")] : [button];
        buttons.forEach(b => { b.disabled = true });
        call(SCHED.name, SCHED.path, SCHED.iface, "DecideApproval", [id, d.decision], "ss")
            .then(([decided]) => {
                const ap = plain(decided);
                showError("approvals-error", null);
                setText("approvals-done", (ap.what || id) + " of " + (ap.agent || "?") + ": " + d.done + " (approval " + id + ", by " + (ap.by || "?") + ").");
            })
            .catch(err => {
                buttons.forEach(b => { b.disabled = false });
                setText("approvals-done", "");
                showError("approvals-error", err, d.label + " of " + id);
            })
            .then(loadApprovals);
    }

    // ---------- usage: tokens and cost per agent per day ----------

    // Usage (root and berth-admin only) lists what each agent's provider
    // calls spent per UTC day, as the runs' egress proxies counted them.
    // A run's end may add to today: RunFinished reloads, coalesced.
    const USAGE_DAY_MS = 24 * 3600 * 1000;
    let usageTimer = null;
    function usageChanged() {
        if (usageTimer)
            return;
        usageTimer = window.setTimeout(() => {
            usageTimer = null;
            if (currentView === "usage")
                loadUsage();
        }, 500);
    }

    // usageDays is the period's days (UTC, 2006-01-02), oldest first.
    function usageDays(n) {
        const today = Date.UTC(new Date().getUTCFullYear(), new Date().getUTCMonth(), new Date().getUTCDate());
        const days = [];
        for (let i = n - 1; i >= 0; i--)
            days.push(new Date(today - i * USAGE_DAY_MS).toISOString().slice(0, 10));
        return days;
    }

    let usageToken = 0;
    function loadUsage() {
        const token = ++usageToken;
        const days = usageDays(Number($("usage-period").value) || 30);
        const sinceUsec = Date.parse(days[0] + "T00:00:00Z") * 1000;
        return call(SCHED.name, SCHED.path, SCHED.iface, "Usage", ["", sinceUsec], "st")
            .then(([list]) => {
                if (token !== usageToken)
                    return;
                state.usage = plain(list).map(d => ({ agent: d.agent, day: d.day, usage: JSON.parse(d.usage || "{}") }));
                state.usageDays = days;
                state.usageError = null;
                state.usage.forEach(d => noteAgent(d.agent));
            })
            .catch(err => {
                if (token !== usageToken)
                    return;
                state.usage = null;
                state.usageError = err;
            })
            .then(() => { if (token === usageToken) renderUsage() });
    }

    function fmtTokens(n) {
        return Number(n || 0).toLocaleString();
    }

    function fmtCost(c) {
        return Number(c || 0).toLocaleString(undefined, { minimumFractionDigits: 2, maximumFractionDigits: 6 });
    }

    function svg(tag, attrs, ...children) {
        const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
        for (const [k, v] of Object.entries(attrs || {}))
            el.setAttribute(k, v);
        for (const c of children)
            el.append(c instanceof Node ? c : document.createTextNode(String(c)));
        return el;
    }

    // usageChart draws one agent's days: per day a tokens bar (input and
    // output) and a cost bar, each scaled to the agent's largest day.
    function usageChart(agent, days, byDay) {
        const barW = 8, gap = 6, height = 120, top = 6;
        const slot = 2 * barW + gap;
        const maxTokens = Math.max(1, ...days.map(d => byDay[d] ? byDay[d].input + byDay[d].output : 0));
        const maxCost = Math.max(1e-12, ...days.map(d => byDay[d] ? byDay[d].cost || 0 : 0));
        const chart = svg("svg", {
            class: "berth-usage-chart", role: "img", width: days.length * slot, height: height + top,
            viewBox: "0 0 " + days.length * slot + " " + (height + top),
            "aria-label": "Tokens and cost of " + agent + " per day",
        });
        days.forEach((day, i) => {
            const u = byDay[day];
            const tokens = u ? u.input + u.output : 0;
            const cost = u ? u.cost || 0 : 0;
            const th = tokens ? Math.max(1, Math.round(height * tokens / maxTokens)) : 0;
            const ch = cost ? Math.max(1, Math.round(height * cost / maxCost)) : 0;
            const x = i * slot;
            chart.append(svg("g", { "data-day": day, "data-tokens": tokens, "data-cost": cost },
                svg("title", {}, day + ": " + fmtTokens(tokens) + " tokens, cost " + fmtCost(cost)),
                svg("rect", { class: "berth-usage-tokens", x: x, y: top + height - th, width: barW, height: th }),
                svg("rect", { class: "berth-usage-cost", x: x + barW, y: top + height - ch, width: barW, height: ch })));
        });
        return chart;
    }

    function usageAgent(agent, days, entries) {
        const byDay = {};
        const total = { calls: 0, input: 0, output: 0, cached: 0, cost: 0, refused: 0 };
        for (const e of entries) {
            const u = e.usage;
            byDay[e.day] = { input: Number(u.input || 0), output: Number(u.output || 0), cost: Number(u.cost || 0) };
            for (const k of Object.keys(total))
                total[k] += Number(u[k] || 0);
        }
        const tokens = total.input + total.output;
        const rows = entries.slice().reverse().map(e => h("tr", { "data-day": e.day },
            h("th", { scope: "row", "data-label": "Day" }, e.day),
            h("td", { "data-label": "Calls" }, String(e.usage.calls || 0)),
            h("td", { "data-label": "Input" }, fmtTokens(e.usage.input)),
            h("td", { "data-label": "Cached" }, fmtTokens(e.usage.cached)),
            h("td", { "data-label": "Output" }, fmtTokens(e.usage.output)),
            h("td", { "data-label": "Cost" }, fmtCost(e.usage.cost)),
            h("td", { "data-label": "Refused" }, String(e.usage.refused || 0))));
        return h("article", { class: "berth-card pf-c-card", "data-usage-agent": agent, "data-tokens": tokens, "data-cost": total.cost, "data-calls": total.calls },
            h("div", { class: "pf-c-card__title" }, h("h3", { class: "pf-c-title pf-m-lg" }, agent)),
            h("div", { class: "pf-c-card__body" },
                h("dl", { class: "berth-counts berth-usage-totals" },
                    h("div", {}, h("dt", {}, "Tokens"), h("dd", { "data-total": "tokens" }, fmtTokens(tokens))),
                    h("div", {}, h("dt", {}, "Cost"), h("dd", { "data-total": "cost" }, fmtCost(total.cost))),
                    h("div", {}, h("dt", {}, "Calls"), h("dd", { "data-total": "calls" }, String(total.calls))),
                    total.refused ? h("div", {}, h("dt", {}, "Refused by a budget"), h("dd", { "data-total": "refused" }, String(total.refused))) : null),
                h("div", { class: "berth-usage-chart-box" }, usageChart(agent, days, byDay)),
                h("p", { class: "berth-muted berth-usage-legend" },
                    h("span", { class: "berth-usage-key berth-usage-tokens" }), " tokens (input and output) ",
                    h("span", { class: "berth-usage-key berth-usage-cost" }), " cost, per day (UTC), " + days[0] + " to " + days[days.length - 1]),
                h("table", { class: "pf-c-table pf-m-compact pf-m-grid-md berth-usage-days" },
                    h("caption", { class: "berth-visually-hidden" }, "Usage of " + agent + " per day, newest first"),
                    h("thead", {}, h("tr", {}, ["Day", "Calls", "Input", "Cached", "Output", "Cost", "Refused"].map(c => h("th", { scope: "col" }, c)))),
                    h("tbody", {}, rows))));
    }

    function renderUsage() {
        const err = state.usageError;
        if (err && isUnknownMethod(err))
            showError("usage-error", { message: "This berth-scheduler counts no usage (no Usage method)." });
        else
            showError("usage-error", err, "Reading usage");
        const byAgent = new Map();
        for (const d of state.usage || []) {
            if (!byAgent.has(d.agent))
                byAgent.set(d.agent, []);
            byAgent.get(d.agent).push(d);
        }
        const agents = [...byAgent.keys()].sort();
        $("usage-agents").replaceChildren(...agents.map(a => usageAgent(a, state.usageDays, byAgent.get(a))));
        $("usage-empty").hidden = !!err || state.usage === null || agents.length > 0;
        document.getElementById("view-usage").dataset.loaded = state.usage === null && !err ? "false" : "true";
    }

    // ---------- views ----------

    let currentView = null;
    const VIEWS = ["overview", "runs", "run", "sandboxes", "schedules", "approvals", "usage", "agents", "images"];

    function route() {
        const path = cockpit.location.path;
        let view = path[0] || "overview";
        if (view === "runs" && path[1])
            view = "run";
        if (!VIEWS.includes(view))
            view = "overview";
        currentView = view;
        for (const v of VIEWS)
            $("view-" + v).hidden = v !== view;
        const tab = view === "run" ? "runs" : view;
        document.querySelectorAll(".pf-c-tabs__item").forEach(li => {
            const on = li.dataset.tab === tab;
            li.classList.toggle("pf-m-current", on);
            const a = li.querySelector("a");
            if (on)
                a.setAttribute("aria-current", "page");
            else
                a.removeAttribute("aria-current");
        });
        shownRun = view === "run" ? path[1] : null;
        switch (view) {
        case "overview": renderOverview(); break;
        case "runs": renderRuns(); loadRuns(); break;
        case "run": $("run-body").hidden = true; showError("run-error", null); loadRun(shownRun); break;
        case "sandboxes": renderSandboxes(); loadSandboxes(); break;
        case "schedules": renderSchedules(); loadSchedules(); break;
        case "approvals": renderApprovals(); loadApprovals(); break;
        case "usage": renderUsage(); loadUsage(); break;
        case "agents": renderAgents(); break;
        case "images": loadImages(); break;
        }
        document.body.dataset.view = view;
    }

    // ---------- refresh loop: signals first, a slow timer as a safety net ----------

    let refreshing = null;
    let refreshAgain = false;
    // refreshAll re-reads everything; a call while one runs (a name that
    // appeared mid-way) runs it once more after it.
    function refreshAll() {
        if (refreshing) {
            refreshAgain = true;
            return refreshing;
        }
        refreshing = refreshPresence()
            .then(() => Promise.all([
                readProps(SCHED, "sched"),
                readProps(INTAKE, "intake"),
                readProps(IMAGES, "images"),
                refreshUnits(),
                probeCancel(),
                probeScheduler("sandboxes", "StopSandbox"),
                probeScheduler("schedules", "RunSchedule"),
                probeScheduler("approvals", "DecideApproval", ["", "allow_once"], "ss"),
                probeImages(),
            ]))
            .then(() => {
                renderAccessNotice();
                renderOverview();
                if (currentView === "images")
                    renderImages();
                if (currentView === "runs")
                    renderRuns();
                // The slow safety net: a missed signal, and "idle for" moving on.
                const reload = currentView === "sandboxes" ? loadSandboxes :
                    currentView === "schedules" ? loadSchedules :
                        currentView === "approvals" ? loadApprovals : () => Promise.resolve();
                return reload();
            })
            .then(() => {
                document.body.dataset.ready = "true";
            })
            .catch(err => console.warn("berth: refresh failed", err))
            .finally(() => {
                refreshing = null;
                if (refreshAgain) {
                    refreshAgain = false;
                    refreshAll().then(subscribeImages);
                }
            });
        return refreshing;
    }

    function subscribe() {
        client(SCHED.name).subscribe({ interface: SCHED.iface, path: SCHED.path }, onSchedulerSignal);
        client(SCHED.name).subscribe({ interface: PROPS, member: "PropertiesChanged", path: SCHED.path }, onPropertiesChanged("sched"));
        client(INTAKE.name).subscribe({ interface: PROPS, member: "PropertiesChanged", path: INTAKE.path }, onPropertiesChanged("intake"));
        driver.subscribe({ interface: "org.freedesktop.DBus", member: "NameOwnerChanged", path: "/org/freedesktop/DBus" },
            (path, iface, signal, args) => {
                const name = args[0];
                if ([SCHED.name, INTAKE.name, IMAGES.name, SYSTEMD.name].includes(name))
                    refreshAll();
            });
    }

    let imagesSubscribed = false;
    function subscribeImages() {
        if (imagesSubscribed || !imagesAvailable())
            return;
        imagesSubscribed = true;
        client(IMAGES.name).subscribe({ interface: IMAGES.iface }, onImagesSignal);
        client(IMAGES.name).subscribe({ interface: PROPS, member: "PropertiesChanged", path: IMAGES.path }, onPropertiesChanged("images"));
    }

    function init() {
        $("filter-agent").addEventListener("change", loadRuns);
        $("filter-state").addEventListener("change", loadRuns);
        $("runs-filter").addEventListener("submit", ev => ev.preventDefault());
        $("runs-more").addEventListener("click", loadMoreRuns);
        $("explain-form").addEventListener("submit", ev => {
            ev.preventDefault();
            const agent = $("explain-agent").value.trim();
            if (agent)
                explain(agent);
        });
        $("build-form").addEventListener("submit", startBuild);
        $("dockerfile-button").addEventListener("click", previewDockerfile);
        $("usage-period").addEventListener("change", loadUsage);
        client(SCHED.name).subscribe({ interface: SCHED.iface, member: "RunFinished", path: SCHED.path }, usageChanged);
        cockpit.addEventListener("locationchanged", route);

        subscribe();
        route();
        refreshAll().then(subscribeImages);
        window.setInterval(() => refreshAll().then(subscribeImages), REFRESH_MS);
        window.setInterval(pollApprovals, APPROVALS_POLL_MS);
    }

    if (document.readyState === "loading")
        document.addEventListener("DOMContentLoaded", init);
    else
        init();
}());
