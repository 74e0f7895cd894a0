// Drives the rlvrd web page (/ui) in headless Chromium for tests/tests/ui.rs, as a person would:
// logs in, lists the jobs, watches a running job's curve grow, opens its gates, opens another
// team's job by its URL, looks at the plugins and model lines, and saves a screenshot of the job
// page. Then the book the daemon serves at /docs: its first page (a screenshot of it too), and a
// link from its table of contents. Prints one JSON object of what it saw; the Rust test judges it.
//
// Input (environment): RLVR_UI_URL (the daemon), RLVR_UI_TOKEN (team A's), RLVR_UI_JOB (team A's
// running job) and RLVR_UI_STEPS (its steps), RLVR_UI_OTHER_JOB (team B's job),
// RLVR_UI_SCREENSHOT and RLVR_UI_BOOK_SCREENSHOT (the PNGs to write).
// NODE_PATH names the node_modules of scripts/ui-browser.sh. With RLVR_UI_SHOTS set to a
// directory, a screenshot of each page it visits goes there too (to look at the pages by eye).

const { chromium } = require('playwright-core');

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};

async function main() {
  const url = env('RLVR_UI_URL');
  const token = env('RLVR_UI_TOKEN');
  const jobId = env('RLVR_UI_JOB');
  const otherJob = env('RLVR_UI_OTHER_JOB');
  const screenshot = env('RLVR_UI_SCREENSHOT');
  const bookScreenshot = env('RLVR_UI_BOOK_SCREENSHOT');
  const steps = Number(env('RLVR_UI_STEPS'));
  const started = Date.now();
  const seconds = () => (Date.now() - started) / 1000;
  const shot = async (page, name) => {
    if (process.env.RLVR_UI_SHOTS) await page.screenshot({ path: `${process.env.RLVR_UI_SHOTS}/${name}.png`, fullPage: true });
  };
  const result = { console_errors: [], requests_without_token: [], timings: {} };

  const browser = await chromium.launch({
    executablePath: process.env.RLVR_CHROMIUM || '/usr/bin/chromium',
    // Root in a container has no user namespaces for Chromium's sandbox.
    args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu'],
  });
  try {
    const context = await browser.newContext({ viewport: { width: 1360, height: 900 }, deviceScaleFactor: 1 });
    const page = await context.newPage();
    page.setDefaultTimeout(20000);
    // The browser logs each answer that is not a success; those are collected apart, with
    // their paths, since some are expected (a wrong token's 401, another team's job's 404).
    result.failed_loads = [];
    page.on('response', (response) => {
      if (response.status() >= 400) result.failed_loads.push(`${response.status()} ${new URL(response.url()).pathname}`);
    });
    page.on('console', (message) => {
      if (message.type() === 'error' && !message.text().startsWith('Failed to load resource')) {
        result.console_errors.push(message.text());
      }
    });
    page.on('pageerror', (error) => result.console_errors.push(`pageerror: ${error.message}`));
    // Every API call after the log-in must carry the token.
    page.on('request', (request) => {
      const path = new URL(request.url()).pathname;
      if (path.startsWith('/v1/') && !request.headers().authorization) result.requests_without_token.push(path);
    });

    // The page, then a wrong token, then team A's.
    const response = await page.goto(`${url}/ui`);
    result.page = {
      status: response.status(),
      url: page.url(),
      content_type: response.headers()['content-type'],
      csp: response.headers()['content-security-policy'],
      nosniff: response.headers()['x-content-type-options'],
    };
    // Issue 36: the login screen shows no navigation ("Log out" among it).
    result.nav_visible_at_login = await page.isVisible('#nav');
    await page.fill('#token', 'not-a-token');
    await page.click('#login button[type=submit]');
    await page.waitForFunction(() => document.querySelector('#login-error')?.textContent.length > 0);
    result.wrong_token = await page.textContent('#login-error');
    await shot(page, 'login');
    await page.fill('#token', token);
    await page.click('#login button[type=submit]');
    await page.waitForSelector(`#jobs tr[data-job="${jobId}"]`);
    result.nav_visible_logged_in = await page.isVisible('#nav');
    result.timings.logged_in_s = seconds();
    await shot(page, 'jobs');
    result.listed = await page.$$eval('#jobs tbody tr', (rows) => rows.map((row) => row.dataset.job));
    // The filters: text that matches nothing, then the job's id.
    await page.fill('#text-filter', 'no job is called this');
    result.rows_filtered_out = await page.$$eval('#jobs tbody tr', (rows) => rows.length);
    await page.fill('#text-filter', jobId.slice(0, 8));
    result.rows_filtered_by_id = await page.$$eval('#jobs tbody tr', (rows) => rows.map((row) => row.dataset.job));
    await page.selectOption('#state-filter', 'published');
    await page.waitForFunction((id) => !document.querySelector(`#jobs tr[data-job="${id}"]`), jobId);
    result.rows_published_filter = await page.$$eval('#jobs tbody tr', (rows) => rows.map((row) => row.dataset.job));
    await page.selectOption('#state-filter', '');
    await page.fill('#text-filter', '');

    // The running job's page: the reward curve's points, sampled while it runs.
    await page.click(`#jobs a[href="#/jobs/${jobId}"]`);
    await page.waitForSelector('[data-chart="reward"] [data-series="reward"]');
    const sample = () => page.evaluate(() => ({
      points: Number(document.querySelector('[data-chart="reward"] [data-series="reward"]')?.dataset.points ?? -1),
      state: document.querySelector('#job-summary')?.dataset.state,
      ended: document.querySelector('section.view')?.dataset.ended === 'true',
    }));
    result.samples = [];
    for (;;) {
      const now = await sample();
      result.samples.push({ t: seconds(), ...now });
      if (now.ended || seconds() > 120) break;
      await page.waitForTimeout(400);
    }
    result.timings.job_ended_s = seconds();
    result.final_state = await page.getAttribute('#job-summary', 'data-state');
    result.summary = await page.$$eval('#job-summary dd[data-field]', (fields) => Object.fromEntries(fields.map((dd) => [dd.dataset.field, dd.textContent])));
    result.charts = await page.$$eval('[data-chart]', (charts) => Object.fromEntries(charts.map((chart) => [
      chart.dataset.chart,
      Object.fromEntries([...chart.querySelectorAll('[data-series]')].map((series) => [series.dataset.series, Number(series.dataset.points)])),
    ])));
    // Each chart's series in drawing order (the last on top), with their colours.
    result.chart_colours = await page.$$eval('[data-chart]', (charts) => Object.fromEntries(charts.map((chart) => [
      chart.dataset.chart,
      [...chart.querySelectorAll('svg [data-series]')].map((series) => [series.dataset.series, getComputedStyle(series).getPropertyValue('--c').trim()]),
    ])));
    result.events = await page.$$eval('#events tbody tr', (rows) => rows.map((row) => row.dataset.state));
    const log = await page.textContent('#log');
    result.log = { chars: log.length, escapes: log.includes('\x1b'), first_step: log.includes('step 1/'), last_step: log.includes(`step ${steps}/${steps} `) };

    // The gate table.
    await page.click('#gates-details > summary');
    await page.waitForSelector('#gates tr[data-criterion]');
    result.gates = await page.$$eval('#gates tbody tr', (rows) => rows.map((row) => ({
      name: row.dataset.criterion,
      status: row.dataset.status,
      cells: [...row.cells].map((cell) => cell.textContent),
    })));
    result.gate_verdict = await page.textContent('#gate-verdict');
    await page.evaluate(() => window.scrollTo(0, 0));
    await page.screenshot({ path: screenshot, fullPage: true });

    // Team B's job, by its URL: the API refuses it, and the page says so.
    await page.goto(`${url}/ui/#/jobs/${otherJob}`);
    const refusal = await page.waitForSelector('.error[data-error-status]');
    result.other_team = {
      status: Number(await refusal.getAttribute('data-error-status')),
      code: await refusal.getAttribute('data-error-code'),
      text: await refusal.textContent(),
    };
    await shot(page, 'other-team');

    // Plugins and model lines.
    await page.goto(`${url}/ui/#/plugins`);
    await page.waitForSelector('#plugins tbody tr');
    await shot(page, 'plugins');
    result.plugins = await page.$$eval('#plugins tbody tr', (rows) => rows.map((row) => row.dataset.plugin));
    await page.goto(`${url}/ui/#/lines`);
    await page.waitForSelector('#lines, #no-lines');
    await shot(page, 'lines');
    result.lines = await page.$$eval('#lines tbody tr', (rows) => rows.map((row) => ({
      line: row.dataset.line,
      versions: [...row.querySelectorAll('a[href*="/"]')].map((link) => link.textContent).filter((text) => text.startsWith('v')),
    })));
    if (result.lines.length && result.lines[0].versions.length) {
      await page.click(`#lines tr[data-line="${result.lines[0].line}"] a:has-text("${result.lines[0].versions[0]}")`);
      await page.waitForSelector('#manifest, .error[data-error-status]');
      await shot(page, 'manifest');
      const error = await page.$('.error[data-error-status]');
      result.manifest = error
        ? { status: Number(await error.getAttribute('data-error-status')) }
        : { status: 200, json: JSON.parse(await page.textContent('#manifest-json')) };
    }

    // The book, in a page of its own so that its console and answers are counted apart: the
    // first page as a reader opens it (/docs, redirected to /docs/), then the job spec's
    // reference from the table of contents, by a relative link.
    const reader = await browser.newContext({ viewport: { width: 1280, height: 900 }, deviceScaleFactor: 1 });
    const book = await reader.newPage();
    book.setDefaultTimeout(20000);
    result.book = { console_errors: [], failed_loads: [] };
    book.on('console', (message) => {
      if (message.type() === 'error') result.book.console_errors.push(message.text());
    });
    book.on('pageerror', (error) => result.book.console_errors.push(`pageerror: ${error.message}`));
    book.on('response', (response) => {
      if (response.status() >= 400) result.book.failed_loads.push(`${response.status()} ${new URL(response.url()).pathname}`);
    });
    const first = await book.goto(`${url}/docs`);
    await book.waitForLoadState('load');
    result.book.first = {
      status: first.status(),
      url: book.url(),
      csp: first.headers()['content-security-policy'],
      h1: await book.textContent('main h1'),
      // mdBook's script builds the table of contents: links in it mean the page's scripts ran.
      toc_links: await book.$$eval('#mdbook-sidebar a[href]', (links) => links.length),
    };
    await book.screenshot({ path: bookScreenshot });
    await book.click('#mdbook-sidebar a[href$="reference/job-spec.html"]');
    // The new page, not the first page's heading before the navigation commits.
    await book.waitForURL('**/docs/reference/job-spec.html');
    result.book.job_spec = { url: book.url(), h1: await book.textContent('main h1') };
    await reader.close();
    result.timings.total_s = seconds();
  } finally {
    await browser.close();
  }
  process.stdout.write(`${JSON.stringify(result)}\n`);
}

main().catch((error) => {
  process.stderr.write(`${error.stack || error}\n`);
  process.exit(1);
});
