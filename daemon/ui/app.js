// The web page of `rlvrd serve` (/ui): jobs, a job's live curves, gates, events and log, model
// lines and plugins, over the same HTTP API and bearer tokens as rlvrctl.
//
// No framework and no build step. Everything a tenant wrote (job names, reasons, logs, plugin
// notes) is put on the page with textContent or setAttribute, never parsed as HTML. The page
// adds no access rule of its own: the API decides what a token sees.

const TOKEN_KEY = 'rlvr.token';
// The API's root: where /ui is served from, so a proxy that mounts the daemon under a prefix
// still works.
const API_ROOT = location.pathname.replace(/ui\/?(index\.html)?$/, '');
const FINAL_STATES = ['published', 'refused', 'failed', 'cancelled'];
const STATES = ['queued', 'admitted', 'running', 'evaluating', 'published', 'refused', 'failed', 'cancelled', 'preempted'];
// As rlvr-client: busy answers (429, 503 with Retry-After) waited out a few times, none longer
// than this.
const BUSY_RETRIES = 3;
const BUSY_WAIT_MAX_S = 30;
// The worker's log is written for a terminal: its colour codes are dropped on the page.
const ANSI_ESCAPE = /\x1b\[[0-9;?]*[ -\/]*[@-~]/g;

// ---- the API ---------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, code, message, field) {
    super(message);
    this.status = status;
    this.code = code;
    this.field = field;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

function apiUrl(path) {
  return API_ROOT + path.replace(/^\//, '');
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => {
      clearTimeout(timer);
      reject(signal.reason);
    }, { once: true });
  });
}

// One request with the token; the answer's Response on success, an ApiError otherwise. A 401
// logs the page out.
async function request(path, { signal, headers = {} } = {}) {
  for (let retries = 0; ; retries++) {
    const response = await fetch(apiUrl(path), {
      headers: { Authorization: `Bearer ${token()}`, ...headers },
      signal,
      cache: 'no-store',
    });
    if (response.ok) return response;
    const wait = Number(response.headers.get('Retry-After'));
    const busy = response.status === 429 || (response.status === 503 && response.headers.has('Retry-After'));
    if (busy && retries < BUSY_RETRIES && wait >= 0 && wait <= BUSY_WAIT_MAX_S) {
      await sleep(wait * 1000, signal);
      continue;
    }
    let error = { code: 'http', message: `${response.status} ${response.statusText}` };
    try {
      const body = await response.json();
      if (body && body.error) error = body.error;
    } catch { /* not the daemon's error body */ }
    if (response.status === 401) logOut(error.message);
    throw new ApiError(response.status, error.code, error.message, error.field);
  }
}

async function getJson(path, options) {
  return (await request(path, options)).json();
}

// Reads a server-sent event stream with fetch (EventSource cannot send the Authorization
// header), calling onEvent({event, id, data}) for each event; resolves when the stream ends.
async function readEvents(path, { signal, lastEventId, onEvent }) {
  const headers = { Accept: 'text/event-stream' };
  if (lastEventId) headers['Last-Event-ID'] = lastEventId;
  const response = await request(path, { signal, headers });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  let event = { event: 'message', id: null, data: [] };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let newline;
    while ((newline = buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = buffer.slice(0, newline);
      buffer = buffer.slice(newline + (buffer.startsWith('\r\n', newline) ? 2 : 1));
      if (line === '') {
        if (event.data.length) onEvent({ event: event.event, id: event.id, data: event.data.join('\n') });
        event = { event: 'message', id: null, data: [] };
        continue;
      }
      if (line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      const text = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
      if (field === 'event') event.event = text;
      else if (field === 'data') event.data.push(text);
      else if (field === 'id') event.id = text;
    }
  }
}

// ---- building the page -----------------------------------------------------------------------

// An element: h('td.num', {title: 'x'}, 'text', child…). Strings become text nodes, never HTML.
function h(tag, attributes = {}, ...children) {
  const [name, ...classes] = tag.split('.');
  const element = document.createElement(name);
  if (classes.length) element.className = classes.join(' ');
  for (const [key, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on')) element.addEventListener(key.slice(2), value);
    else element.setAttribute(key, value === true ? '' : String(value));
  }
  append(element, children);
  return element;
}

function append(element, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

const SVG = 'http://www.w3.org/2000/svg';
function s(tag, attributes = {}, ...children) {
  const element = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (value !== undefined && value !== null) element.setAttribute(key, String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

function fixed(value, digits = 4) {
  return typeof value === 'number' && Number.isFinite(value) ? value.toFixed(digits) : '—';
}

function signed(value) {
  return typeof value === 'number' ? (value >= 0 ? '+' : '') + value.toFixed(4) : '—';
}

function when(rfc3339) {
  if (!rfc3339) return '—';
  const date = new Date(rfc3339);
  return Number.isNaN(date.getTime()) ? rfc3339 : date.toLocaleString();
}

function stateBadge(state) {
  return h(`span.state.state-${STATES.includes(state) ? state : 'unknown'}`, {}, state);
}

function errorBox(error) {
  const text = error instanceof ApiError
    ? `${error.message} (${error.status} ${error.code}${error.field ? `, ${error.field}` : ''})`
    : String(error && error.message ? error.message : error);
  return h('p.error', { role: 'alert', 'data-error-code': error?.code, 'data-error-status': error?.status }, text);
}

// `run` made to run once at a time: a call while it runs makes it run once more after, so the
// last call's answer is always seen, and two reads never interleave (the log is read from where
// the last read ended).
function singleFlight(run) {
  let running = null, again = false;
  const call = () => {
    if (running) {
      again = true;
      return running;
    }
    running = (async () => {
      try {
        do {
          again = false;
          await run();
        } while (again);
      } finally {
        running = null;
      }
    })();
    return running;
  };
  return call;
}

// ---- log in and routes -----------------------------------------------------------------------

const main = document.getElementById('main');
// Aborted when the page leaves a view: its streams and timers stop with it.
let viewController = null;

function logOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  if (viewController) viewController.abort();
  showLogin(message);
}

function showLogin(message) {
  document.getElementById('nav').hidden = true;
  const form = document.getElementById('login-template').content.firstElementChild.cloneNode(true);
  main.replaceChildren(form);
  const error = form.querySelector('#login-error');
  if (message) error.textContent = message;
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const value = form.querySelector('#token').value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    try {
      // Any token route tells whether the token is known.
      await request('/v1/plugins');
    } catch (failure) {
      sessionStorage.removeItem(TOKEN_KEY);
      showLogin(failure instanceof ApiError ? `token refused: ${failure.message}` : String(failure));
      return;
    }
    if (!location.hash || location.hash === '#' || location.hash === '#/') location.hash = '#/jobs';
    else route();
  });
  form.querySelector('#token').focus();
}

function route() {
  if (viewController) viewController.abort();
  if (!token()) {
    showLogin();
    return;
  }
  viewController = new AbortController();
  const signal = viewController.signal;
  document.getElementById('nav').hidden = false;
  const [path] = location.hash.replace(/^#\/?/, '').split('?');
  const parts = path.split('/').map((part) => {
    try { return decodeURIComponent(part); } catch { return part; }
  });
  for (const link of document.querySelectorAll('#nav a')) {
    link.classList.toggle('current', link.dataset.route === (parts[0] || 'jobs'));
  }
  const view = h('section.view');
  main.replaceChildren(view);
  let shown;
  if (parts[0] === 'jobs' && parts[1]) shown = jobPage(view, parts[1], signal);
  else if (parts[0] === 'lines' && parts[1] && parts[2]) shown = manifestPage(view, parts[1], parts[2], signal);
  else if (parts[0] === 'lines' && parts[1]) shown = linePage(view, parts[1], signal);
  else if (parts[0] === 'lines') shown = linesPage(view, signal);
  else if (parts[0] === 'plugins') shown = pluginsPage(view, signal);
  else shown = jobsPage(view, signal);
  shown.catch((error) => {
    if (signal.aborted) return;
    view.append(errorBox(error));
  });
}

document.getElementById('logout').addEventListener('click', () => logOut());
window.addEventListener('hashchange', route);
route();

// ---- jobs ------------------------------------------------------------------------------------

const jobHref = (id) => `#/jobs/${encodeURIComponent(id)}`;

async function jobsPage(view, signal) {
  const stateFilter = h('select', { id: 'state-filter', 'aria-label': 'state' },
    h('option', { value: '' }, 'every state'), STATES.map((state) => h('option', { value: state }, state)));
  const textFilter = h('input', { id: 'text-filter', type: 'search', placeholder: 'name, id or model line', 'aria-label': 'filter' });
  const body = h('tbody');
  const status = h('p.muted', { id: 'jobs-status' });
  const more = h('button', { type: 'button', hidden: true }, 'More');
  const params = new URLSearchParams(location.hash.split('?')[1] || '');
  stateFilter.value = params.get('state') || '';
  textFilter.value = params.get('q') || '';
  view.append(
    h('h1', {}, 'Jobs'),
    h('div.filters', {}, h('label', {}, 'State ', stateFilter), h('label', {}, 'Find ', textFilter)),
    h('table.jobs', { id: 'jobs' },
      h('thead', {}, h('tr', {}, ['Job', 'Name', 'Team', 'State', 'Step', 'Reward', 'Held-out', 'Model line', 'Updated'].map((name) => h('th', {}, name)))),
      body),
    more, status);

  let jobs = [];
  let next = null;
  const matches = (job) => {
    const text = textFilter.value.trim().toLowerCase();
    if (!text) return true;
    return [job.id, job.name, job.model_line, job.team].some((field) => String(field).toLowerCase().includes(text));
  };
  const draw = () => {
    const shown = jobs.filter(matches);
    body.replaceChildren(...shown.map((job) => h('tr', { 'data-job': job.id, 'data-state': job.state },
      h('td', {}, h('a', { href: jobHref(job.id) }, job.id)),
      h('td', {}, job.name),
      h('td', {}, job.team),
      h('td', {}, stateBadge(job.state)),
      h('td.num', {}, `${job.step}/${job.max_steps}`),
      h('td.num', {}, fixed(job.progress?.reward)),
      h('td.num', {}, fixed(job.heldout)),
      h('td', {}, job.model_line),
      h('td', {}, when(job.updated_at)))));
    status.textContent = `${shown.length} of ${jobs.length} jobs shown`;
    more.hidden = !next;
  };
  const load = async () => {
    const query = new URLSearchParams({ limit: '100' });
    if (stateFilter.value) query.set('state', stateFilter.value);
    const answer = await getJson(`/v1/jobs?${query}`, { signal });
    jobs = answer.jobs;
    next = answer.next || null;
    draw();
  };
  more.addEventListener('click', () => (async () => {
    const query = new URLSearchParams({ limit: '100', cursor: next });
    if (stateFilter.value) query.set('state', stateFilter.value);
    const answer = await getJson(`/v1/jobs?${query}`, { signal });
    jobs = jobs.concat(answer.jobs);
    next = answer.next || null;
    draw();
  })().catch(showError));
  const remember = () => {
    const query = new URLSearchParams();
    if (stateFilter.value) query.set('state', stateFilter.value);
    if (textFilter.value) query.set('q', textFilter.value);
    history.replaceState(null, '', `#/jobs${query.size ? `?${query}` : ''}`);
  };
  stateFilter.addEventListener('change', () => { remember(); load().catch(showError); });
  textFilter.addEventListener('input', () => { remember(); draw(); });
  const showError = (error) => { if (!signal.aborted) status.replaceChildren(errorBox(error)); };
  await load();
  // The list is a snapshot: refreshed every few seconds while it is shown.
  (async () => {
    while (!signal.aborted) {
      await sleep(3000, signal);
      if (!next) await load().catch(showError);
    }
  })().catch(() => {});
}

// The curves of a job page: each chart's series from the metrics lines.
const CHARTS = [
  {
    id: 'reward', title: 'Reward',
    series: (lines) => {
      const steps = lines.filter((line) => typeof line.reward_mean === 'number');
      const names = [...new Set(steps.flatMap((line) => Object.keys(line.components || {})))].sort();
      return [
        { name: 'reward', points: steps.map((line) => [line.step, line.reward_mean]) },
        ...names.map((name) => ({
          name: `component ${name}`,
          points: steps.filter((line) => typeof line.components?.[name] === 'number').map((line) => [line.step, line.components[name]]),
        })),
      ];
    },
  },
  { id: 'heldout', title: 'Held-out accuracy', series: (lines) => [{ name: 'held-out', points: pick(lines, (line) => line.heldout?.accuracy) }] },
  { id: 'kl', title: 'KL to the reference', series: (lines) => [{ name: 'kl', points: pick(lines, (line) => line.kl_ref) }] },
  { id: 'length', title: 'Completion length (tokens)', series: (lines) => [{ name: 'length', points: pick(lines, (line) => line.completion_len_mean) }] },
  { id: 'step-time', title: 'Step time (s)', series: (lines) => [{ name: 'step time', points: pick(lines, (line) => line.time?.step_s) }] },
];

function pick(lines, value) {
  return lines.filter((line) => typeof value(line) === 'number').map((line) => [line.step, value(line)]);
}

// The series colours of app.css (`.series-0` …).
const SERIES_COLOURS = 12;

// A line chart drawn in SVG: one polyline (and its points) per series, axes with their range.
function chart(spec, lines) {
  const width = 420, height = 200, left = 52, right = 10, top = 10, bottom = 26;
  // The first series is always drawn (its legend says it has no data yet); the others when they
  // have points.
  const series = spec.series(lines).filter((one, index) => index === 0 || one.points.length);
  const all = series.flatMap((one) => one.points);
  const svg = s('svg', { viewBox: `0 0 ${width} ${height}`, class: 'chart', role: 'img', 'aria-label': spec.title });
  const figure = h('figure.chart', { 'data-chart': spec.id }, h('figcaption', {}, spec.title), svg);
  if (!all.length) {
    svg.append(s('text', { x: width / 2, y: height / 2, 'text-anchor': 'middle', class: 'empty' }, 'no data yet'));
  }
  // Folded rather than spread: a long job has more points than a call takes arguments.
  const extent = (values, start) => values.reduce(([low, high], value) => [Math.min(low, value), Math.max(high, value)], start);
  let [x0, x1] = extent(all.map((point) => point[0]), [0, 1]);
  let [y0, y1] = all.length ? extent(all.map((point) => point[1]), [Infinity, -Infinity]) : [0, 1];
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  if (x0 === x1) x1 = x0 + 1;
  const X = (x) => left + ((x - x0) / (x1 - x0)) * (width - left - right);
  const Y = (y) => top + (1 - (y - y0) / (y1 - y0)) * (height - top - bottom);
  svg.append(
    s('line', { x1: left, y1: height - bottom, x2: width - right, y2: height - bottom, class: 'axis' }),
    s('line', { x1: left, y1: top, x2: left, y2: height - bottom, class: 'axis' }),
    s('text', { x: left - 4, y: top + 8, 'text-anchor': 'end', class: 'tick' }, formatTick(y1)),
    s('text', { x: left - 4, y: height - bottom, 'text-anchor': 'end', class: 'tick' }, formatTick(y0)),
    s('text', { x: left, y: height - 8, 'text-anchor': 'start', class: 'tick' }, `step ${x0}`),
    s('text', { x: width - right, y: height - 8, 'text-anchor': 'end', class: 'tick' }, `step ${x1}`),
  );
  const legend = h('ul.legend');
  // As many colours as a chart has series (the reward chart: the reward and one per component);
  // the first series, the chart's own figure, is drawn last so no other line hides it.
  const groups = [];
  series.forEach((one, index) => {
    const color = `series-${index % SERIES_COLOURS}`;
    const group = s('g', { class: color, 'data-series': one.name, 'data-points': one.points.length });
    if (one.points.length > 1) {
      group.append(s('polyline', { points: one.points.map(([x, y]) => `${X(x).toFixed(1)},${Y(y).toFixed(1)}`).join(' '), class: 'line' }));
    }
    // Each point as a dot with its value on hover, while there are few enough to see apart.
    for (const [x, y] of one.points.length <= 200 ? one.points : []) {
      group.append(s('circle', { cx: X(x).toFixed(1), cy: Y(y).toFixed(1), r: 2.5, class: 'point' }, s('title', {}, `step ${x}: ${y}`)));
    }
    groups.unshift(group);
    const last = one.points[one.points.length - 1];
    legend.append(h(`li.${color}`, {}, h('span.swatch'), `${one.name}`, last ? ` ${fixed(last[1])}` : ''));
  });
  svg.append(...groups);
  figure.append(legend);
  return figure;
}

function formatTick(value) {
  const magnitude = Math.abs(value);
  return magnitude !== 0 && (magnitude < 0.01 || magnitude >= 10000) ? value.toExponential(1) : Number(value.toPrecision(3)).toString();
}

// The gate table: each criterion's status, measured value, threshold and interval.
function gateTable(report) {
  const rows = report.criteria.map((criterion) => h('tr', { 'data-criterion': criterion.name, 'data-status': criterion.status },
    h('td', {}, criterion.name),
    h('td', {}, h(`span.gate.gate-${criterion.status}`, {}, { pass: 'pass', fail: 'FAIL', not_checked: 'not checked' }[criterion.status] || criterion.status)),
    h('td.num', {}, fixed(criterion.measured)),
    h('td.num', {}, criterion.threshold === null || criterion.threshold === undefined ? '—' : `${criterion.op} ${criterion.threshold}`),
    h('td.num', {}, criterion.interval ? intervalText(criterion.interval) : '—'),
    h('td', {}, criterion.note)));
  const summary = [
    h('p', { id: 'gate-verdict' }, report.passed ? 'The gates passed.' : 'The gates refused the candidate.',
      report.forced ? ` Promoted by ${report.forced.by} at ${when(report.forced.at)}: ${report.forced.reason}` : ''),
  ];
  if (report.baseline) {
    summary.push(h('p.muted', {}, `Baseline: ${report.baseline.kind}${report.baseline.version != null ? ` version ${report.baseline.version}` : ''} (${report.baseline.model})`));
  }
  if (report.candidate) {
    summary.push(h('p.muted', {}, `Candidate: checkpoint step ${report.candidate.step}${typeof report.candidate.heldout === 'number' ? `, held-out ${fixed(report.candidate.heldout)}` : ''}`));
  }
  return h('div', {},
    summary,
    h('table.gates', { id: 'gates' },
      h('thead', {}, h('tr', {}, ['Criterion', 'Status', 'Measured', 'Threshold', 'Interval', 'What was measured'].map((name) => h('th', {}, name)))),
      h('tbody', {}, rows)));
}

// `[+0.0208, +0.1458] 95%, 48 prompts (5 better, 1 worse)`, as the CLI's gate table writes it.
function intervalText(interval) {
  return `${signed(interval.estimate)} [${signed(interval.low)}, ${signed(interval.high)}] ${Math.round(interval.confidence * 100)}%, ${interval.prompts} prompts (${interval.improved} better, ${interval.regressed} worse)`;
}

async function jobPage(view, id, signal) {
  // First the job: one this token may not see is the API's 404 alone, with no empty page around it.
  let job = await getJson(`/v1/jobs/${encodeURIComponent(id)}`, { signal });
  const heading = h('h1', {}, 'Job ', h('code', {}, id));
  const summary = h('dl.summary', { id: 'job-summary' });
  const charts = h('div.charts', { id: 'charts' });
  const gates = h('div', { id: 'gates-section' }, h('p.muted', {}, 'No gate report yet: the gates judge the job when training ends.'));
  const eventsBody = h('tbody');
  const log = h('pre.log', { id: 'log' });
  view.append(
    heading, summary,
    h('h2', {}, 'Curves'), charts,
    h('details.gates', { id: 'gates-details' }, h('summary', {}, 'Gates'), gates),
    h('h2', {}, 'Events'),
    h('table.events', { id: 'events' }, h('thead', {}, h('tr', {}, ['At', 'State', 'Step', 'Reason'].map((name) => h('th', {}, name)))), eventsBody),
    h('h2', {}, 'Log'), log);

  let lines = [];
  let metricsEnd = 0;
  let logEnd = null;

  const drawSummary = () => {
    const progress = job.progress || {};
    const items = [
      ['Name', job.name], ['Team', job.team], ['Kind', job.kind ? job.kind.replaceAll('_', ' ') : '—'], ['State', stateBadge(job.state)],
      ['Step', `${job.step}/${job.max_steps}`], ['Reward', fixed(progress.reward)], ['Held-out', fixed(job.heldout)],
      ['KL', fixed(progress.kl)], ['Step time', progress.step_s != null ? `${fixed(progress.step_s, 2)} s` : '—'],
      ['Model line', job.model_line], ['Submitted', when(job.created_at)],
    ];
    if (job.reason) items.push(['Reason', job.reason]);
    const output = job.output;
    if (output && output.kind === 'checkpoint') items.push(['Published', h('a', { href: `#/lines/${encodeURIComponent(output.line)}/${output.version}` }, `${output.line} version ${output.version}`)]);
    if (output && output.kind === 'dataset') items.push(['Published', h('code', {}, `dataset:${output.name}@${output.sha256}`)]);
    summary.replaceChildren(...items.flatMap(([name, value]) => [h('dt', {}, name), h('dd', { 'data-field': name.toLowerCase() }, value)]));
    summary.setAttribute('data-state', job.state);
    heading.replaceChildren('Job ', h('code', {}, id), ' ', h('span.muted', {}, job.name));
  };
  const drawCharts = () => charts.replaceChildren(...CHARTS.map((spec) => chart(spec, lines)));
  const drawGates = () => {
    if (job.gates) gates.replaceChildren(gateTable(job.gates));
  };

  // The metrics a window at a time, from where the last read ended: a long job's history is
  // read once, not again at every refresh.
  const refreshMetrics = singleFlight(async () => {
    for (;;) {
      const chunk = await getJson(`/v1/jobs/${encodeURIComponent(id)}/metrics?since=${metricsEnd}`, { signal });
      // A history cut back by a resume is read again from its start.
      if (chunk.start < metricsEnd) lines = [];
      lines = lines.concat(chunk.lines);
      const moved = chunk.end > metricsEnd || chunk.start < metricsEnd;
      metricsEnd = chunk.end;
      if (chunk.end >= chunk.size || !moved) break;
    }
    drawCharts();
  });
  const refreshLog = singleFlight(async () => {
    const query = logEnd === null ? 'bytes=65536' : `since=${logEnd}`;
    const chunk = await getJson(`/v1/jobs/${encodeURIComponent(id)}/logs?${query}`, { signal });
    // A log that was cut or replaced starts again.
    if (logEnd !== null && chunk.start !== logEnd) log.textContent = '';
    if (chunk.text) {
      const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
      log.append(document.createTextNode(chunk.text.replace(ANSI_ESCAPE, '')));
      if (atBottom) log.scrollTop = log.scrollHeight;
    }
    logEnd = chunk.end;
  });
  const refreshJob = singleFlight(async () => {
    job = await getJson(`/v1/jobs/${encodeURIComponent(id)}`, { signal });
    drawSummary();
    drawGates();
  });
  const quietly = (promise) => promise.catch((error) => { if (!signal.aborted) console.warn(error); });

  drawSummary();
  drawGates();
  drawCharts();
  await Promise.all([refreshMetrics(), refreshLog()]);

  // Follow the event stream to the job's end, resuming after the last state event on a drop.
  let lastEventId = null, ended = false, lastStep = job.step;
  while (!signal.aborted && !ended) {
    try {
      await readEvents(`/v1/jobs/${encodeURIComponent(id)}/events`, {
        signal, lastEventId,
        onEvent: ({ event, id: eventId, data }) => {
          const payload = JSON.parse(data);
          if (event === 'state') {
            lastEventId = eventId;
            eventsBody.append(h('tr', { 'data-state': payload.state },
              h('td', {}, when(payload.at)), h('td', {}, stateBadge(payload.state)),
              h('td.num', {}, payload.step), h('td', {}, payload.reason)));
            if (FINAL_STATES.includes(payload.state)) ended = true;
            quietly(refreshJob());
            quietly(refreshMetrics());
            quietly(refreshLog());
          } else if (event === 'progress') {
            job = payload;
            drawSummary();
            if (payload.step !== lastStep) {
              lastStep = payload.step;
              quietly(refreshMetrics());
              quietly(refreshLog());
            }
          }
        },
      });
      if (!ended) await sleep(1000, signal);
    } catch (error) {
      if (signal.aborted) return;
      if (error instanceof ApiError && error.status < 500 && error.status !== 429) throw error;
      await sleep(2000, signal);
    }
  }
  if (ended) {
    await Promise.all([refreshJob(), refreshMetrics(), refreshLog()]);
    view.setAttribute('data-ended', 'true');
  }
}

// ---- model lines -----------------------------------------------------------------------------

const lineHref = (name, version) => `#/lines/${encodeURIComponent(name)}${version !== undefined ? `/${encodeURIComponent(version)}` : ''}`;

async function linesPage(view, signal) {
  const { lines } = await getJson('/v1/model-lines', { signal });
  append(view, [h('h1', {}, 'Model lines'),
    lines.length ? h('table.lines', { id: 'lines' },
      h('thead', {}, h('tr', {}, ['Line', 'Owner', 'Readers', 'Publishers', 'Versions'].map((name) => h('th', {}, name)))),
      h('tbody', {}, lines.map((line) => h('tr', { 'data-line': line.name },
        h('td', {}, h('a', { href: lineHref(line.name) }, line.name)),
        h('td', {}, line.owner),
        h('td', {}, line.readers.join(', ') || '—'),
        h('td', {}, line.publishers.join(', ') || '—'),
        h('td', {}, line.versions.length ? line.versions.map((version, index) => [index ? ' ' : '', h('a', { href: lineHref(line.name, version) }, `v${version}`)]) : '—')))))
      : h('p.muted', { id: 'no-lines' }, 'No model line yet: a job publishes its first version.')]);
}

async function linePage(view, name, signal) {
  const line = await getJson(`/v1/model-lines/${encodeURIComponent(name)}`, { signal });
  append(view, [h('h1', {}, 'Model line ', h('code', {}, line.name)),
    h('dl.summary', {}, h('dt', {}, 'Owner'), h('dd', {}, line.owner),
      h('dt', {}, 'Readers'), h('dd', {}, line.readers.join(', ') || '—'),
      h('dt', {}, 'Publishers'), h('dd', {}, line.publishers.join(', ') || '—')),
    h('h2', {}, 'Versions'),
    line.versions.length
      ? h('ul.versions', {}, [...line.versions].reverse().map((version) => h('li', {}, h('a', { href: lineHref(line.name, version) }, `version ${version}`))))
      : h('p.muted', {}, 'Nothing published yet.'),
    h('h2', {}, 'Gate policy'), h('pre.json', {}, JSON.stringify(line.policy, null, 2))]);
}

async function manifestPage(view, name, version, signal) {
  const manifest = await getJson(`/v1/model-lines/${encodeURIComponent(name)}/versions/${encodeURIComponent(version)}`, { signal });
  const files = Object.entries(manifest.files || {});
  append(view, [h('h1', {}, h('a', { href: lineHref(name) }, name), ` version ${manifest.version}`),
    h('dl.summary', { id: 'manifest' },
      h('dt', {}, 'Job'), h('dd', {}, h('a', { href: jobHref(manifest.job_id) }, manifest.job_id)),
      h('dt', {}, 'Step'), h('dd', {}, manifest.step),
      h('dt', {}, 'Published'), h('dd', {}, when(manifest.published_at)),
      h('dt', {}, 'Weights SHA-256'), h('dd', {}, h('code', {}, manifest.weights_sha256)),
      h('dt', {}, 'Data SHA-256'), h('dd', {}, typeof manifest.data_sha256 === 'object' && manifest.data_sha256
        ? Object.entries(manifest.data_sha256).map(([file, sha]) => h('div', {}, `${file}: `, h('code', {}, sha)))
        : h('code', {}, manifest.data_sha256))),
    h('h2', {}, 'Gates'), manifest.gates?.criteria ? gateTable(manifest.gates) : h('p.muted', {}, '—'),
    h('h2', {}, 'Files'),
    files.length ? h('table', {}, h('thead', {}, h('tr', {}, h('th', {}, 'File'), h('th', {}, 'SHA-256'))),
      h('tbody', {}, files.map(([file, sha]) => h('tr', {}, h('td', {}, file), h('td', {}, h('code', {}, sha)))))) : h('p.muted', {}, '—'),
    h('details', {}, h('summary', {}, 'The whole manifest'), h('pre.json', { id: 'manifest-json' }, JSON.stringify(manifest, null, 2)))]);
}

// ---- plugins ---------------------------------------------------------------------------------

async function pluginsPage(view, signal) {
  const { plugins, refused } = await getJson('/v1/plugins', { signal });
  append(view, [h('h1', {}, 'Plugins'),
    h('table.plugins', { id: 'plugins' },
      h('thead', {}, h('tr', {}, ['Plugin', 'Kind', 'Description', 'SHA-256', 'Loaded'].map((name) => h('th', {}, name)))),
      h('tbody', {}, plugins.map((plugin) => h('tr', { 'data-plugin': plugin.id },
        h('td', {}, plugin.id), h('td', {}, plugin.kind),
        h('td', {}, plugin.description, plugin.notes?.length ? h('ul.notes', {}, plugin.notes.map((note) => h('li', {}, note))) : null),
        h('td', {}, h('code', { title: plugin.sha256 }, plugin.sha256.slice(0, 12))),
        h('td', {}, when(plugin.loaded_at)))))),
    refused.length ? [h('h2', {}, 'Refused'), h('table', {},
      h('thead', {}, h('tr', {}, ['File', 'Reason', 'Message', 'At'].map((name) => h('th', {}, name)))),
      h('tbody', {}, refused.map((entry) => h('tr', {}, h('td', {}, entry.source), h('td', {}, entry.reason), h('td', {}, entry.message), h('td', {}, when(entry.at))))))] : null]);
}
