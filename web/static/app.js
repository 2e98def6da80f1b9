// The natstone dashboard: one page over natstone's JSON API (package web documents it). No build
// step and no dependency. Text from the API reaches the page only as text nodes and attribute
// values, never as HTML.
'use strict';

const REFRESH_MS = 2000;
const PAGE_LIMIT = 50;
const STATES = ['invisible', 'pending', 'running', 'completed', 'canceled', 'errored'];
const TABS = ['pending', 'running', 'invisible', 'completed', 'canceled', 'errored'];
const RATES = ['enqueued', 'dequeued', 'completed', 'errored'];

const $view = document.getElementById('view');
const $crumbs = document.getElementById('crumbs');
const $error = document.getElementById('error');
const $updated = document.getElementById('updated');
const $notServing = document.getElementById('not-serving');
const $pause = document.getElementById('refresh-toggle');

let paused = false;
let current = null; // the view on screen: {root, update, busy}

// ---- DOM and formatting helpers ----

// h builds an element. attrs: a function value is an event listener ("onclick"), true an empty
// attribute, null/undefined/false nothing; children: nodes, strings, numbers or arrays of them.
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (typeof v === 'function') el.addEventListener(k.replace(/^on/, ''), v);
    else el.setAttribute(k, v === true ? '' : k === 'title' ? shown(String(v)) : String(v));
  }
  el.append(...nodes(children));
  return el;
}

// set replaces el's children, taking the same children as h.
function set(el, ...children) {
  el.replaceChildren(...nodes(children));
}

function nodes(children) {
  return children.flat(Infinity)
    .filter(c => c !== undefined && c !== null && c !== false)
    .map(c => (c instanceof Node ? c : shown(String(c))));
}

// shown makes the characters that change how text reads without being seen — bidirectional
// controls, zero-width spaces and joiners (Unicode's format characters), the other characters
// Unicode says to draw as nothing (variation selectors, Hangul fillers…), line and paragraph
// separators — visible as ⟨U+202E⟩: ids, metadata and the other text clients chose would
// otherwise show "invoice-\u202E2401" as "invoice-1042", so that an operator acts on another
// message than the one they read. Children and titles go through it (h, set); text that is
// content, a payload, goes through verbatim instead. Look-alike letters of other scripts are
// not caught.
const invisibleChars = /[\p{Cf}\p{Default_Ignorable_Code_Point}\u2028\u2029]/gu;
function shown(s) {
  return s.replace(invisibleChars, c => '⟨U+' + c.codePointAt(0).toString(16).toUpperCase().padStart(4, '0') + '⟩');
}

// verbatim is text as it is, not passed through shown.
function verbatim(s) {
  return document.createTextNode(s);
}

const enc = encodeURIComponent;

function queueHref(name, params) {
  const q = new URLSearchParams(params || {}).toString();
  return '#/queues/' + enc(name) + (q ? '?' + q : '');
}

function messageHref(queue, id) {
  return '#/queues/' + enc(queue) + '/messages/' + enc(id);
}

function apiQueue(name) {
  return '/api/queues/' + enc(name);
}

// duration formats milliseconds for people: 350 ms, 4.2 s, 12 s, 3m 05s, 2h 10m, 3d 4h.
function duration(ms) {
  if (ms === undefined || ms === null) return '—';
  ms = Math.max(0, Math.round(ms));
  if (ms < 1000) return ms + ' ms';
  const s = ms / 1000;
  if (s < 10) return s.toFixed(1) + ' s';
  if (s < 60) return Math.floor(s) + ' s';
  const m = Math.floor(s / 60);
  if (m < 60) return m + 'm ' + String(Math.floor(s % 60)).padStart(2, '0') + 's';
  const hr = Math.floor(m / 60);
  if (hr < 48) return hr + 'h ' + String(m % 60).padStart(2, '0') + 'm';
  return Math.floor(hr / 24) + 'd ' + (hr % 24) + 'h';
}

function rate(r) {
  if (!r) return '0';
  return r < 0.1 ? r.toFixed(3) : r < 10 ? r.toFixed(2) : r.toFixed(1);
}

function time(t) {
  return t ? new Date(t).toISOString().replace('T', ' ').replace('Z', ' UTC') : '—';
}

// clock is the time of day of t (UTC, to the millisecond), with the whole time as its tooltip.
function clock(t) {
  return t ? h('span', { title: time(t) }, new Date(t).toISOString().slice(11, 23)) : '—';
}

// priority shows a priority, and the deadline it stands for when it looks like Unix milliseconds.
function priority(p) {
  return p >= 1e12 && p < 1e13 ? [String(p), h('span', { class: 'muted' }, ' (' + time(p).slice(0, 16) + ' UTC)')] : String(p);
}

// ago says how long ago t was, or how long until it is.
function ago(t) {
  if (!t) return '—';
  const d = Date.now() - new Date(t).getTime();
  return d >= 0 ? duration(d) + ' ago' : 'in ' + duration(-d);
}

function stateBadge(state) {
  return h('span', { class: 'badge state-' + state }, state);
}

function blockedBadges(cfg) {
  return [
    cfg.enqueue_blocked ? h('span', { class: 'badge blocked', 'data-blocked': 'enqueue', title: 'enqueues are refused' }, 'enqueue blocked') : null,
    cfg.dequeue_blocked ? h('span', { class: 'badge blocked', 'data-blocked': 'dequeue', title: 'dequeues are refused' }, 'dequeue blocked') : null,
  ];
}

function metadataList(md) {
  const keys = Object.keys(md || {}).sort();
  if (keys.length === 0) return h('span', { class: 'muted' }, '—');
  return h('span', { class: 'pairs' }, keys.map(k => h('code', { class: 'pair' }, k + '=' + md[k])));
}

// bar is a horizontal bar filled to fraction (0 to 1).
function bar(fraction, cls) {
  const fill = h('span', { class: 'fill ' + (cls || '') });
  fill.style.width = (Math.max(0, Math.min(1, fraction || 0)) * 100).toFixed(2) + '%';
  return h('span', { class: 'bar' }, fill);
}

// facts builds a definition list from [term, value, attrs] rows.
function facts(rows) {
  return rows.flatMap(([term, value, attrs]) => [h('dt', {}, term), h('dd', attrs || {}, value)]);
}

// ---- the API ----

// exactInts quotes the priorities of a JSON text that a JavaScript number cannot hold exactly (16
// digits or more: past 2^53), so that they are shown as stored, not rounded. A payload's text cannot
// match: its quotes are escaped.
function exactInts(text) {
  return text.replace(/"priority":(-?\d{16,})/g, '"priority":"$1"');
}

async function api(path, init) {
  const res = await fetch(path, Object.assign({ headers: { Accept: 'application/json' }, cache: 'no-store' }, init));
  let body = null;
  try {
    body = JSON.parse(exactInts(await res.text()));
  } catch (_) {
    // Not JSON: the status says enough.
  }
  if (!res.ok) {
    const e = body && body.error;
    const err = new Error(e ? e.message : res.status + ' ' + res.statusText);
    err.code = e ? e.code : 'http_' + res.status;
    throw err;
  }
  return body;
}

// post sends body as JSON to an API path and returns the reply (the API refuses any other content
// type, which keeps forms of other sites out).
function post(path, body) {
  return api(path, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json' },
    body: JSON.stringify(body),
  });
}

// postOnClick makes a click on button POST body to path, the button disabled meanwhile, then show
// the error if there is one and call then (the view's refresh). It returns the button.
function postOnClick(button, path, body, then) {
  button.addEventListener('click', async () => {
    button.disabled = true;
    setActionError(null);
    try {
      await post(path, body);
    } catch (err) {
      setActionError(err);
    } finally {
      button.disabled = false;
    }
    then();
  });
  return button;
}

function query(pairs) {
  const q = new URLSearchParams(pairs).toString();
  return q ? '?' + q : '';
}

// escapePair writes a filter pair in the filter box's syntax, which parseFilter reads.
function escapePair(p) {
  return p.replace(/[\\,]/g, c => '\\' + c).replace(/^\s|\s$/g, c => '\\' + c);
}

// parseFilter turns "k=v, k2=v2" into ["k=v", "k2=v2"], throwing on a piece that is not key=value.
// A backslash takes the next character as it is: "k=a\,b" is the one pair k = "a,b", and
// "k= v\ " keeps the value " v " whole (white space at a pair's ends is trimmed unless escaped).
function parseFilter(text) {
  const pieces = [];
  let piece = []; // [character, escaped]
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '\\' && i + 1 < text.length) {
      piece.push([text[++i], true]);
    } else if (c === ',') {
      pieces.push(piece);
      piece = [];
    } else {
      piece.push([c, false]);
    }
  }
  pieces.push(piece);
  const blank = ([c, escaped]) => !escaped && /\s/.test(c);
  const pairs = pieces.map(p => {
    let from = 0, to = p.length;
    while (from < to && blank(p[from])) from++;
    while (to > from && blank(p[to - 1])) to--;
    return p.slice(from, to).map(([c]) => c).join('');
  }).filter(p => p !== '');
  for (const p of pairs) {
    if (p.indexOf('=') < 1) throw new Error('filter "' + p + '": want key=value');
  }
  return pairs;
}

// ---- routing and refresh ----

function parseRoute() {
  const raw = location.hash.replace(/^#/, '');
  const i = raw.indexOf('?');
  const path = i < 0 ? raw : raw.slice(0, i);
  const params = new URLSearchParams(i < 0 ? '' : raw.slice(i + 1));
  let parts;
  try {
    parts = path.split('/').filter(p => p !== '').map(decodeURIComponent);
  } catch (_) {
    return { view: 'notFound' };
  }
  if (parts.length === 0 || (parts.length === 1 && parts[0] === 'queues')) return { view: 'queues', after: params.get('after') || '', limit: params.get('limit') || '' };
  if (parts[0] !== 'queues') return { view: 'notFound' };
  if (parts.length === 2) {
    const state = params.get('state') || 'pending';
    if (!STATES.includes(state)) return { view: 'notFound' };
    return { view: 'queue', queue: parts[1], state, filter: params.get('filter') || '', after: params.get('after') || '' };
  }
  if (parts.length === 4 && parts[2] === 'messages') return { view: 'message', queue: parts[1], id: parts[3] };
  return { view: 'notFound' };
}

function show() {
  const r = parseRoute();
  const v = views[r.view](r);
  current = v;
  setError(null);
  setActionError(null);
  $updated.textContent = ''; // this view's own, once it has data
  set($crumbs, ...crumbs(r));
  set($view, v.root);
  refresh(v);
}

function crumbs(r) {
  const out = [h('a', { href: '#/' }, 'queues')];
  if (r.queue) out.push(' › ', h('a', { href: queueHref(r.queue) }, r.queue));
  if (r.id) out.push(' › ', h('span', {}, r.id));
  return out;
}

// refresh updates v with fresh data unless an update of it is already running. The view's root gets
// data-loaded once it shows data, and data-refreshes counts its successful updates.
async function refresh(v) {
  if (!v || v.busy) return;
  v.busy = true;
  checkServing();
  try {
    await v.update();
    v.root.dataset.loaded = 'true';
    v.root.dataset.refreshes = String(Number(v.root.dataset.refreshes || 0) + 1);
    v.root.classList.remove('stale');
    if (v === current) {
      setError(null);
      $updated.textContent = 'updated ' + new Date().toISOString().slice(11, 19) + ' UTC';
    }
  } catch (err) {
    if (v.root.dataset.loaded) v.root.classList.add('stale'); // what is shown is no longer current
    if (v === current) setError(err);
  } finally {
    v.busy = false;
  }
}

// The banner shows what failed: an action's error (a click's, a switch's, a filter's), which stays
// until the next action, a click on the banner or another page, however often the view refreshes
// meanwhile; else the last refresh's, which the next refresh that succeeds clears.
let refreshError = null;
let actionError = null;

function setError(err) {
  refreshError = err;
  showError();
}

// checkServing marks the page of a natstone that does not serve (/readyz 503: a standby, or one cut
// off from its store). Without a /readyz (404: the web package mounted without Config.Ready), or
// when it cannot be asked, it says nothing.
async function checkServing() {
  try {
    const res = await fetch('readyz', { cache: 'no-store' });
    $notServing.hidden = res.status !== 503;
  } catch (_) {
    $notServing.hidden = true;
  }
}

function setActionError(err) {
  actionError = err;
  showError();
}

function showError() {
  const err = actionError || refreshError;
  $error.hidden = !err;
  $error.dataset.kind = actionError ? 'action' : 'refresh';
  let text = err ? (err.code ? err.code + ': ' : '') + err.message : '';
  if (err && !err.code && err instanceof TypeError) {
    // fetch's own failure ("Failed to fetch"): natstone did not answer at all.
    text = 'natstone does not answer (' + err.message + '): what is shown is as it was when last updated';
  }
  $error.textContent = shown(text);
}

$error.addEventListener('click', () => setActionError(null));

$pause.addEventListener('click', () => {
  paused = !paused;
  $pause.textContent = paused ? 'Resume' : 'Pause';
  $pause.setAttribute('aria-pressed', String(paused));
  if (!paused) refresh(current);
});

// ---- views ----

const views = { queues: queuesView, queue: queueView, message: messageView, notFound: notFoundView };

function notFoundView() {
  return { root: h('section', { 'data-view': 'not-found' }, h('h1', {}, 'Not found'), h('p', {}, h('a', { href: '#/' }, 'Back to the queues'))), update: async () => {} };
}

// queuesView: the queues, a page at a time (the stats of each are asked at every refresh), with
// their counts per state, rates and oldest pending message.
function queuesView(r) {
  const body = h('tbody');
  const empty = h('p', { class: 'muted', hidden: true }, 'No queues yet: enqueue a message or create a queue with the natstone CLI.');
  const more = h('p', { class: 'muted', id: 'queues-more', hidden: true });
  const root = h('section', { 'data-view': 'queues' },
    h('h1', {}, 'Queues'),
    h('table', { id: 'queues', class: 'grid' },
      h('thead', {}, h('tr', {},
        h('th', {}, 'queue'), h('th', {}, 'type'),
        STATES.map(s => h('th', { class: 'num' }, s)),
        RATES.map(r => h('th', { class: 'num', title: r + ' per second over the last minute' }, r + '/s')),
        h('th', { class: 'num' }, 'oldest pending'))),
      body),
    more,
    empty);

  function row(q) {
    const cell = (attrs, text) => h('td', Object.assign({ class: 'num', 'data-queue': q.name }, attrs), text);
    return h('tr', { 'data-queue': q.name },
      h('td', {}, h('a', { href: queueHref(q.name) }, q.name), ' ', blockedBadges(q)),
      h('td', {}, q.type, q.exclusivity_key ? h('span', { class: 'muted' }, ' by ' + q.exclusivity_key) : null),
      STATES.map(s => cell({ 'data-state': s, class: q.counts[s] ? 'num' : 'num zero' }, q.counts[s])),
      RATES.map(r => cell({ 'data-rate': r }, rate(q.rates[r]))),
      cell({ 'data-oldest-pending-ms': q.oldest_pending_ms }, q.counts.pending ? duration(q.oldest_pending_ms) : '—'));
  }

  return {
    root,
    async update() {
      const page = p => { // the query of a page: after (none for the first), and the limit asked
        const q = new URLSearchParams(Object.entries(Object.assign(p, r.limit ? { limit: r.limit } : {})).filter(([, v]) => v));
        const s = q.toString(); // (URLSearchParams.size is newer than some browsers still about)
        return s ? '?' + s : '';
      };
      const data = await api('/api/queues' + page({ after: r.after }));
      set(body, ...data.queues.map(row));
      empty.hidden = data.queues.length > 0 || r.after !== '';
      // Pages of data.limit queues, each after the last of the one before (list's cursor, in the address).
      const links = [];
      if (r.after) links.push(h('a', { id: 'queues-first', href: '#/queues' + page({}) }, '« first page'));
      if (data.more) links.push(h('a', { id: 'queues-next', href: '#/queues' + page({ after: data.next }) }, 'next ' + data.limit + ' »'));
      more.hidden = links.length === 0;
      set(more, ...links.flatMap((a, i) => i ? [' · ', a] : [a]));
    },
  };
}

// stateColumn is the state-specific column of the messages table: [heading, cell of a message].
function stateColumn(state) {
  switch (state) {
    case 'pending': return ['pending for', m => ago(m.visible_at).replace(' ago', '')];
    case 'invisible': return ['pending', m => ago(m.visible_at)];
    case 'running': return ['lease ends', m => [h('code', {}, m.lease_id || ''), ' ', ago(m.lease_expires_at)]];
    default: return ['ended', m => ago(m.ended_at)];
  }
}

// queueView: one queue's numbers, its pause switches and its messages of one state.
function queueView(r) {
  const name = r.queue;
  let filter = [];
  let filterError = null;
  try {
    filter = parseFilter(r.filter);
  } catch (err) {
    filterError = err;
  }
  const filterPairs = filter.map(f => ['filter', f]);
  let togglesInFlight = 0;

  const badges = h('span', { id: 'badges' });
  const counts = h('div', { class: 'cards', id: 'counts' });
  const numbers = h('dl', { class: 'facts', id: 'numbers' });
  const config = h('dl', { class: 'facts', id: 'config' });
  const expiring = h('tbody');
  const expiringNone = h('p', { class: 'muted', hidden: true }, 'No lease ends within 30 s.');
  const schedules = h('tbody');
  const schedulesSection = h('section', { id: 'schedules-section', hidden: true },
    h('h2', {}, 'Schedules'),
    h('table', { id: 'schedules', class: 'grid' },
      h('thead', {}, h('tr', {}, h('th', {}, 'name'), h('th', {}, 'cron'), h('th', {}, 'next fire'),
        h('th', {}, 'last fire'), h('th', { class: 'num' }, 'skipped'), h('th', {}, 'overlap'), h('th', {}, ''))),
      schedules));
  const enqueueSwitch = blockSwitch('enqueue_blocked', 'Block enqueues');
  const dequeueSwitch = blockSwitch('dequeue_blocked', 'Block dequeues');

  const filterInput = h('input', {
    id: 'filter', type: 'text', value: r.filter, placeholder: 'key=value, key2=a\\,b',
    title: 'pairs key=value, comma-separated; a backslash takes the next character as it is (\\, for a comma in a value)',
    'aria-label': 'metadata filter', autocomplete: 'off', spellcheck: 'false',
  });
  const filterForm = h('form', { id: 'filter-form', class: 'filter', onsubmit: e => { e.preventDefault(); applyFilter(filterInput.value); } },
    filterInput, h('button', { type: 'submit' }, 'Filter'),
    r.filter ? h('button', { type: 'button', id: 'filter-clear', onclick: () => applyFilter('') }, 'Clear') : null);

  const tabs = h('nav', { class: 'tabs', role: 'tablist' }, TABS.map(s => h('a', {
    href: queueHref(name, tabParams(s, r.filter)), role: 'tab', 'data-tab': s,
    'aria-selected': String(s === r.state), class: s === r.state ? 'tab active' : 'tab',
  }, s, ' ', h('span', { class: 'tab-count', 'data-tab-count': s }))));

  const [heading, column] = stateColumn(r.state);
  const messages = h('tbody');
  const more = h('p', { class: 'muted', id: 'more', hidden: true });
  const root = h('section', { 'data-view': 'queue', 'data-queue': name, 'data-state': r.state, 'data-filter': filter.join(','), 'data-after': r.after },
    h('h1', {}, name, ' ', badges),
    h('div', { class: 'switches' }, enqueueSwitch.el, dequeueSwitch.el),
    counts,
    h('div', { class: 'cols' },
      h('section', {}, h('h2', {}, 'Activity'), numbers),
      h('section', {}, h('h2', {}, 'Config'), config)),
    h('h2', {}, 'Leases about to expire'),
    h('table', { id: 'expiring', class: 'grid' },
      h('thead', {}, h('tr', {}, h('th', {}, 'message'), h('th', {}, 'lease'), h('th', { class: 'num' }, 'expires in'), h('th', { class: 'num' }, 'attempt'))),
      expiring),
    expiringNone,
    schedulesSection,
    h('h2', {}, 'Messages'),
    tabs,
    filterForm,
    h('table', { id: 'messages', class: 'grid' },
      h('thead', {}, h('tr', {},
        h('th', {}, 'id'), h('th', { class: 'num' }, 'priority'), h('th', {}, 'metadata'),
        h('th', { class: 'num' }, 'attempt'), h('th', {}, heading))),
      messages),
    more);

  function tabParams(state, f) {
    const p = { state };
    if (f) p.filter = f;
    return p;
  }

  function applyFilter(text) {
    let pairs;
    setActionError(null);
    try {
      pairs = parseFilter(text);
    } catch (err) {
      setActionError(err);
      return;
    }
    // Each pair as the box's syntax writes it: a comma or a backslash in it escaped, so that
    // parseFilter reads the same pairs back from the address.
    const target = queueHref(name, tabParams(r.state, pairs.map(escapePair).join(',')));
    if (location.hash === target) refresh(view);
    else location.hash = target;
  }

  // A schedule can be paused (it fires at none of its times until resumed), resumed (it fires
  // next at its first time after now), or fired now, out of its times: its message enqueued at
  // once, with the id <name>@<now, to the millisecond>.
  function scheduleButton(s, action, label) {
    return postOnClick(h('button', { type: 'button', class: 'schedule-' + action }, label),
      apiQueue(name) + '/schedules/' + encodeURIComponent(s.name) + '/' + action, {}, () => refresh(view));
  }

  // A switch that blocks asks for a second click, on a Confirm button beside it for 5 seconds: one
  // misclick would otherwise stop a queue's producers or workers. Unblocking takes one click.
  function blockSwitch(field, label) {
    // Disabled until the queue's flags are known (setSwitches): a switch shown off before that
    // would say a blocked queue is not, and a click on it would set what nobody saw.
    const id = 'toggle-' + field.replace('_', '-');
    const input = h('input', { type: 'checkbox', role: 'switch', id, 'data-flag': field, disabled: true });
    const confirm = h('button', { type: 'button', id: id + '-confirm', hidden: true }, 'Confirm: ' + label.toLowerCase());
    let disarm = null;
    async function apply(want) {
      togglesInFlight++;
      input.disabled = true;
      setActionError(null);
      try {
        const info = await post(apiQueue(name) + '/blocked', { [field]: want });
        setSwitches(info.config);
      } catch (err) {
        input.checked = !want;
        setActionError(err);
      } finally {
        togglesInFlight--;
        input.disabled = false;
      }
      refresh(view);
    }
    input.addEventListener('change', () => {
      if (!input.checked) {
        apply(false);
        return;
      }
      input.checked = false; // not blocked until confirmed
      confirm.hidden = false;
      clearTimeout(disarm);
      disarm = setTimeout(() => { confirm.hidden = true; }, 5000);
    });
    confirm.addEventListener('click', () => {
      clearTimeout(disarm);
      confirm.hidden = true;
      input.checked = true;
      apply(true);
    });
    return { input, el: h('span', { class: 'switch-group' }, h('label', { class: 'switch' }, input, ' ', label), ' ', confirm) };
  }

  function setSwitches(cfg) {
    enqueueSwitch.input.checked = cfg.enqueue_blocked;
    dequeueSwitch.input.checked = cfg.dequeue_blocked;
    enqueueSwitch.input.disabled = dequeueSwitch.input.disabled = false;
    set(badges, blockedBadges(cfg));
  }

  function render(q, list) {
    if (togglesInFlight === 0) setSwitches(q.config);
    set(counts, ...STATES.map(s => h('div', { class: 'card state-' + s },
      h('div', { class: 'card-label' }, s), h('div', { class: 'card-value', 'data-count': s }, q.counts[s]))));
    for (const el of tabs.querySelectorAll('[data-tab-count]')) el.textContent = q.counts[el.dataset.tabCount];

    set(numbers, ...facts([
      ['oldest pending', q.counts.pending ? duration(q.oldest_pending_ms) : '—', { 'data-oldest-pending-ms': q.oldest_pending_ms }],
      ...RATES.map(k => [k + ' per second', rate(q.rates[k]), { 'data-rate': k }]),
      ['since start', ['enqueued', 'dequeued', 'completed', 'canceled', 'errored', 'released', 'expired', 'retried', 'rescheduled', 'collected']
        .map(k => k + ' ' + q.totals[k]).join(' · ')],
      ...(filter.length ? [['counts', 'of the messages matching ' + filter.join(', ')]] : []),
    ]));
    const c = q.config;
    set(config, ...facts([
      ['type', c.type + (c.exclusivity_key ? ' by ' + c.exclusivity_key : '') +
        (c.max_running_per_value > 1 ? ', ' + c.max_running_per_value + ' running per value' : '')],
      ['lease', duration(c.lease_ms)],
      ['invisibility', duration(c.invisible_ms)],
      ['max attempts', c.max_attempts],
      ['retention', duration(c.retention_ms)],
      ['max payload', c.max_payload_bytes + ' bytes'],
      ['max running', c.max_running ? c.max_running : 'no limit'],
      ['revision', q.revision],
      ['created', time(q.created_at)],
    ]));

    set(expiring, ...q.expiring.map(l => h('tr', { 'data-message-id': l.id },
      h('td', {}, h('a', { href: messageHref(name, l.id) }, l.id)),
      h('td', {}, h('code', {}, l.lease_id)),
      h('td', { class: 'num' }, duration(l.expires_in_ms)),
      h('td', { class: 'num' }, l.attempts + '/' + l.max_attempts))));
    expiringNone.hidden = q.expiring.length > 0;

    // A fire enqueued last_id, or enqueued nothing for last_error.
    set(schedules, ...q.schedules.map(s => h('tr', { 'data-schedule': s.name },
      h('td', {}, s.name),
      h('td', {}, h('code', {}, s.cron)),
      // invalid: stored by an earlier version in a form this one cannot read; it never fires.
      s.invalid ? h('td', { class: 'schedule-error' }, 'never: ' + s.invalid)
        : s.paused ? h('td', { class: 'schedule-paused', title: 'paused ' + time(s.paused_at) + (s.note ? ': ' + s.note : '') },
          'paused' + (s.note ? ': ' + s.note : ''))
          : h('td', { title: time(s.next_at) }, ago(s.next_at)),
      h('td', {}, s.last_error ? h('span', { class: 'schedule-error', title: time(s.last_at) }, (s.last_error_code || 'error') + ': ' + s.last_error)
        : s.last_id ? h('a', { href: messageHref(name, s.last_id), title: time(s.last_at) }, s.last_id) : '—'),
      h('td', { class: 'num' }, s.skipped),
      // skip: no fire while the last fire's message is unfinished; how many it left out.
      h('td', { class: 'schedule-overlap' }, s.overlap + (s.overlap_skipped ? ' (' + s.overlap_skipped + ' left out)' : '')),
      h('td', {}, s.invalid ? '' : [s.paused ? scheduleButton(s, 'resume', 'Resume') : scheduleButton(s, 'pause', 'Pause'), ' ',
        scheduleButton(s, 'fire', 'Fire now')]))));
    schedulesSection.hidden = q.schedules.length === 0;

    set(messages, ...list.messages.map(m => h('tr', { 'data-message-id': m.id, 'data-priority': m.priority },
      h('td', {}, h('a', { href: messageHref(name, m.id) }, m.id)),
      h('td', { class: 'num' }, m.priority),
      h('td', {}, metadataList(m.metadata)),
      h('td', { class: 'num' }, m.attempts + '/' + (m.attempts + m.attempts_left)),
      h('td', {}, column(m)))));
    if (list.messages.length === 0) {
      messages.append(h('tr', {}, h('td', { colspan: 5, class: 'muted' }, 'No ' + r.state + ' message' + (filter.length ? ' matches the filter.' : '.'))));
    }
    // Pages of PAGE_LIMIT, each after the last of the one before (browse's cursor, in the address).
    const links = [];
    if (r.after) links.push(h('a', { id: 'page-first', href: queueHref(name, tabParams(r.state, r.filter)) }, '« first page'));
    if (list.more) links.push(h('a', { id: 'page-next', href: queueHref(name, Object.assign(tabParams(r.state, r.filter), { after: list.next })) }, 'next ' + PAGE_LIMIT + ' »'));
    more.hidden = links.length === 0;
    set(more, ...links.flatMap((a, i) => i ? [' · ', a] : [a]));
  }

  const view = {
    root,
    async update() {
      if (filterError) throw filterError;
      const [q, list] = await Promise.all([
        api(apiQueue(name) + query(filterPairs)),
        api(apiQueue(name) + '/messages' + query([['state', r.state], ...filterPairs, ['limit', PAGE_LIMIT], ...(r.after ? [['after', r.after]] : [])])),
      ]);
      render(q, list);
    },
  };
  return view;
}

// messageView: one message's fields, payload and history timeline.
function messageView(r) {
  const fields = h('dl', { class: 'facts', id: 'fields' });
  const actions = h('div', { class: 'actions', id: 'actions' });
  const metadata = h('div', { id: 'metadata' });
  const payload = h('div', { id: 'payload' });
  const summary = h('div', { class: 'totals', id: 'history-summary' });
  const lifebar = h('div', { class: 'lifebar', id: 'lifebar' });
  const timeline = h('tbody', { id: 'timeline' });
  const root = h('section', { 'data-view': 'message', 'data-queue': r.queue, 'data-message-id': r.id },
    h('h1', {}, 'Message ', h('code', {}, r.id)),
    actions,
    h('div', { class: 'cols' },
      h('section', {}, h('h2', {}, 'Fields'), fields),
      h('section', {}, h('h2', {}, 'Metadata'), metadata)),
    h('h2', {}, 'Payload'), payload,
    h('h2', {}, 'History'), summary, lifebar,
    h('table', { id: 'events', class: 'grid' },
      h('thead', {}, h('tr', {},
        h('th', { class: 'num' }, 'version'), h('th', {}, 'event'), h('th', {}, 'at (UTC)'), h('th', {}, 'state'),
        h('th', { class: 'num' }, 'attempt'), h('th', {}, 'worker'), h('th', {}, 'lease'), h('th', {}, 'time in state'))),
      timeline));

  // A finished message that failed (errored or canceled) can be retried: pending again, its
  // attempts anew. An invisible message can be run now: pending at once (a reschedule with
  // delay_ms 0). A message not finished can be canceled, in two clicks: Cancel arms a Confirm
  // cancel button for 5 seconds (refreshes keep it armed). Each click acts on the version shown,
  // nothing the message became since.
  let armed = null; // the version whose cancel waits for its confirmation
  let disarm = null;
  function renderActions(m) {
    const parts = [];
    if (m && (m.state === 'errored' || m.state === 'canceled')) {
      parts.push(actionButton('retry', 'Retry', m, '/retry', {}), ' ',
        h('span', { class: 'muted' }, 'pending again, with ' + (m.attempts + m.attempts_left) + ' attempts anew'));
    }
    if (m && m.state === 'invisible') {
      parts.push(actionButton('run-now', 'Run now', m, '/reschedule', { delay_ms: 0 }), ' ',
        h('span', { class: 'muted' }, 'pending at once instead of ' + ago(m.visible_at)), ' ');
    }
    if (m && (m.state === 'invisible' || m.state === 'pending' || m.state === 'running')) {
      if (armed === m.version) {
        parts.push(actionButton('cancel-confirm', 'Confirm cancel', m, '/cancel', {}), ' ',
          h('span', { class: 'muted' }, m.state === 'running' ? 'its lease ends: the worker learns it at its next extend or complete' : 'it will not run'));
      } else {
        const button = h('button', { type: 'button', id: 'cancel' }, 'Cancel…');
        button.addEventListener('click', () => {
          armed = m.version;
          clearTimeout(disarm);
          disarm = setTimeout(() => { armed = null; renderActions(last); }, 5000);
          renderActions(m);
        });
        parts.push(button);
      }
    }
    set(actions, ...parts);
  }

  // actionButton POSTs {id, version, ...fields} to the queue's path when clicked, then refreshes.
  function actionButton(id, label, m, path, fields) {
    const button = h('button', { type: 'button', id, 'data-version': m.version }, label);
    return postOnClick(button, apiQueue(r.queue) + path, Object.assign({ id: r.id, version: m.version }, fields), () => refresh(view));
  }

  let last = null; // the message last rendered
  function renderMessage(m, events) {
    last = m;
    renderActions(m);
    if (!m) {
      set(fields, h('p', { class: 'muted' }, 'Garbage-collected after its retention; its history remains.'));
      const enqueued = events.find(e => e.kind === 'enqueued');
      set(metadata, metadataList(enqueued && enqueued.metadata));
      set(payload, h('p', { class: 'muted' }, 'Gone with the message.'));
      return;
    }
    set(fields, ...facts([
      ['state', stateBadge(m.state), { 'data-field': 'state' }],
      ['priority', priority(m.priority), { 'data-field': 'priority' }],
      ['version', m.version, { 'data-field': 'version' }],
      ['attempts', m.attempts + ' of ' + (m.attempts + m.attempts_left), { 'data-field': 'attempts' }],
      ['lease', m.state === 'running' ? [h('code', {}, m.lease_id), ' ends ', ago(m.lease_expires_at)] : '—'],
      ['enqueued', time(m.enqueued_at)],
      ['visible', time(m.visible_at)],
      ['updated', time(m.updated_at)],
      ['ended', time(m.ended_at)],
    ]));
    set(metadata, metadataList(m.metadata));
    if (m.payload_omitted) {
      set(payload, h('p', { class: 'muted', 'data-payload-size': m.payload_size }, m.payload_size + ' bytes: over 4 KiB, not shown.'));
    } else if (m.payload_base64) {
      set(payload, h('p', { class: 'muted', 'data-payload-size': m.payload_size }, m.payload_size + ' bytes, not UTF-8; in base64:'), h('pre', { class: 'payload' }, m.payload_base64));
    } else if (m.payload) {
      set(payload, h('pre', { class: 'payload', 'data-payload-size': m.payload_size }, verbatim(m.payload)));
    } else {
      set(payload, h('p', { class: 'muted', 'data-payload-size': 0 }, 'Empty.'));
    }
  }

  function renderHistory(hist, err) {
    if (!hist) {
      set(summary, h('p', { class: 'muted' }, 'No history: ' + (err ? err.message : 'unavailable') + '.'));
      set(lifebar);
      set(timeline);
      return;
    }
    const events = hist.events || [];
    const stateMS = hist.state_ms || {};
    const total = STATES.reduce((sum, s) => sum + (stateMS[s] || 0), 0);
    const longest = Math.max(1, ...events.map(e => e.state_ms || 0));
    set(summary,
      ...STATES.filter(s => stateMS[s]).map(s => h('span', { class: 'total', 'data-state-ms': s },
        h('span', { class: 'dot state-' + s }), s + ' ' + duration(stateMS[s]))),
      h('span', { class: hist.failures ? 'total failures' : 'total', id: 'failures', 'data-failures': hist.failures },
        hist.failures + ' failed attempt' + (hist.failures === 1 ? '' : 's')),
      hist.collected ? h('span', { class: 'total muted' }, 'collected') : null,
      hist.truncated ? h('span', { class: 'total muted' }, 'only the first ' + events.length + ' events are shown') : null);

    set(lifebar, ...events.filter(e => e.state && e.state_ms > 0).map(e => {
      const seg = h('span', { class: 'seg state-' + e.state, title: e.state + ' for ' + duration(e.state_ms) + ' from version ' + e.version });
      seg.style.width = (e.state_ms / Math.max(1, total) * 100).toFixed(3) + '%';
      return seg;
    }));

    set(timeline, ...events.map(e => h('tr', { 'data-event-kind': e.kind, 'data-event-version': e.version, class: e.current ? 'current' : null },
      h('td', { class: 'num' }, e.version),
      h('td', {}, h('span', { class: 'kind kind-' + e.kind }, e.kind), e.reason ? ' (' + e.reason + ')' : '',
        e.kind === 'rescheduled' ? ' (priority ' + e.priority + ')' : '',
        e.error ? h('div', { class: 'event-error' }, e.error) : null),
      h('td', { class: 'nowrap' }, clock(e.at)),
      h('td', { class: 'nowrap' }, e.prev_state ? e.prev_state + ' → ' : '', e.state ? stateBadge(e.state) : '—'),
      h('td', { class: 'num' }, e.attempts + '/' + e.max_attempts),
      h('td', {}, e.worker || ''),
      h('td', {}, e.lease_id ? h('code', {}, e.lease_id) : '', e.lease_expires_at ? [' until ', clock(e.lease_expires_at)] : ''),
      h('td', { class: 'dur' }, e.state ? [bar(e.state_ms / longest, 'state-' + e.state), ' ', duration(e.state_ms), e.current ? ' so far' : ''] : ''))));
  }

  const view = {
    root,
    async update() {
      // The id in the query: a path would lose an id of "." or "..", which browsers resolve.
      const data = await api(apiQueue(r.queue) + '/message?id=' + enc(r.id));
      const events = (data.history && data.history.events) || [];
      renderMessage(data.message, events);
      renderHistory(data.history, data.history_error);
    },
  };
  return view;
}

window.addEventListener('hashchange', show);
setInterval(() => {
  if (!paused && !document.hidden) refresh(current);
}, REFRESH_MS);
show();
