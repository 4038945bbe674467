// Renders API documentation pages in headless Chromium (Debian's package, driven by playwright-core) with the
// network cut off at the machine: every request to a host other than 127.0.0.1/localhost is blocked (route
// interception) and recorded. Used by tests/clients/test_docs_render.py:
//
//   node render-docs.mjs '{"outDir": "/tmp/shots", "pages": [{"name": "front-docs",
//                          "url": "http://127.0.0.1:7000/docs", "viewer": "swagger"}, ...]}'
//
// Prints one JSON object, {"pages": [...], "probe": {...}}; each page: its spec, status, headers, title,
// operations (the rendered endpoints as "METHOD /path": Swagger UI's .opblock summaries, ReDoc's endpoint verbs
// and paths), menu (the operation ids listed: Swagger UI's .opblock ids, ReDoc's side-menu entries), offsite (the
// off-machine requests the browser reported: {url, intercepted, error}, each blocked), refused (what the page's Content-Security-Policy refused
// before any request: {directive, url}), failed (local requests that failed or answered 4xx/5xx),
// consoleErrors, pageErrors and screenshot (a PNG in outDir); with "tryItOut": an operation id, Swagger UI's
// "Try it out" of that operation is executed and its live response read ({status, body}). The probe checks the recorder itself: a CDN fetch
// from a page of the first origin must be blocked and recorded.
import { existsSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const LOCAL_HOSTS = new Set(["127.0.0.1", "localhost", "[::1]"]);
const PROBE_URL = "https://cdn.jsdelivr.net/npm/swagger-ui-dist@5/swagger-ui.css";
const TIMEOUT_MS = 60_000;

function isLocal(url) {
  const u = new URL(url);
  if (u.protocol === "data:" || u.protocol === "blob:" || u.protocol === "about:") return true;
  return (u.protocol === "http:" || u.protocol === "https:") && LOCAL_HOSTS.has(u.hostname);
}

function chromiumPath() {
  // The Debian package's binary (its /usr/bin/chromium is a shell launcher around it).
  for (const path of ["/usr/lib/chromium/chromium", "/usr/bin/chromium"]) if (existsSync(path)) return path;
  throw new Error("no Chromium at /usr/lib/chromium/chromium or /usr/bin/chromium (tests/clients/js/setup.sh)");
}

/** A browser context whose every off-machine request is blocked and recorded in ``offsite``: one entry per URL,
 * ``{url, intercepted, error}``: ``intercepted`` when it reached the network layer (where the route aborts it),
 * ``error`` how it failed ("net::ERR_BLOCKED_BY_CLIENT…": the route aborted it; "csp": the page's
 * Content-Security-Policy refused it before any request). */
async function cutOffContext(browser) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const offsite = [];
  const entry = (url) => {
    let found = offsite.find((o) => o.url === url);
    if (!found) offsite.push((found = { url, intercepted: false, error: null }));
    return found;
  };
  await context.route("**/*", (route) => {
    const url = route.request().url();
    if (isLocal(url)) return route.continue();
    entry(url).intercepted = true;
    return route.abort("blockedbyclient");
  });
  // Every request the browser reports, routed or not (service workers, redirects, policy refusals).
  context.on("request", (request) => {
    if (!isLocal(request.url())) entry(request.url());
  });
  context.on("requestfailed", (request) => {
    if (!isLocal(request.url())) entry(request.url()).error = request.failure()?.errorText ?? "failed";
  });
  return { context, offsite };
}

const EXTRACT = {
  swagger: () => {
    const blocks = [...document.querySelectorAll(".opblock")];
    return {
      title: document.querySelector(".info .title")?.textContent?.trim() ?? null,
      operations: blocks.map((b) => {
        const method = b.querySelector(".opblock-summary-method")?.textContent?.trim().toUpperCase();
        const pathNode = b.querySelector(".opblock-summary-path");
        const path = (pathNode?.getAttribute("data-path") ?? pathNode?.textContent ?? "").replace(/\u200b/g, "");
        return `${method} ${path.trim()}`;
      }),
      // Swagger UI's block ids are "operations-<tag>-<operationId>".
      menu: blocks.map((b) => b.id),
    };
  },
  redoc: () => ({
    title: document.querySelector("h1")?.textContent?.trim() ?? null,
    operations: [...document.querySelectorAll(".http-verb")].map(
      (verb) => `${verb.textContent.trim().toUpperCase()} ${verb.nextElementSibling?.textContent?.trim() ?? ""}`,
    ),
    // ReDoc's side menu: one entry per operation, "operation/<operationId>" (or "tag/<tag>/operation/<id>").
    menu: [...document.querySelectorAll("[data-item-id*='operation/']")].map((e) => e.getAttribute("data-item-id")),
  }),
};

const READY = { swagger: ".opblock .opblock-summary-path", redoc: ".http-verb" };

async function render(browser, spec, outDir) {
  const { context, offsite } = await cutOffContext(browser);
  const page = await context.newPage();
  // What the page's Content-Security-Policy refused (the browser never asks the network for those).
  await page.addInitScript(() => {
    window.__refused = [];
    document.addEventListener("securitypolicyviolation", (e) =>
      window.__refused.push({ directive: e.effectiveDirective, url: e.blockedURI }),
    );
  });
  const failed = [];
  const consoleErrors = [];
  const pageErrors = [];
  page.on("requestfailed", (r) => {
    if (isLocal(r.url())) failed.push(`${r.url()}: ${r.failure()?.errorText}`);
  });
  page.on("response", (r) => {
    if (r.status() >= 400) failed.push(`${r.url()}: HTTP ${r.status()}`);
  });
  page.on("console", (m) => {
    if (m.type() === "error") consoleErrors.push(m.text());
  });
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  const response = await page.goto(spec.url, { waitUntil: "load", timeout: TIMEOUT_MS });
  const status = response?.status() ?? null;
  const headers = response ? await response.allHeaders() : {};
  await page.waitForSelector(READY[spec.viewer], { timeout: TIMEOUT_MS });
  await page.waitForLoadState("networkidle", { timeout: TIMEOUT_MS });
  const found = await page.evaluate(EXTRACT[spec.viewer]);
  const refused = await page.evaluate(() => window.__refused);
  const tryItOut = spec.tryItOut ? await tryOut(page, spec.tryItOut) : null;
  const screenshot = join(outDir, `${spec.name}.png`);
  await page.screenshot({ path: screenshot, fullPage: spec.viewer === "swagger" });
  await context.close();
  return {
    ...spec,
    status,
    headers,
    ...found,
    tryItOut,
    offsite,
    refused,
    failed,
    consoleErrors,
    pageErrors,
    screenshot,
  };
}

/** Swagger UI's "Try it out" on the operation ``operationId`` (no parameters): open it, execute, and read the live
 * response's status and body as the page shows them (the page's own same-origin request, under its policy). */
async function tryOut(page, operationId) {
  const block = page.locator(`.opblock[id$="-${operationId}"]`);
  await block.locator(".opblock-summary").first().click();
  await block.locator("button.try-out__btn").click();
  await block.locator("button.execute").click();
  const live = block.locator(".live-responses-table .response");
  await live.first().waitFor({ timeout: TIMEOUT_MS });
  return {
    status: (await live.locator(".response-col_status").first().textContent()).trim(),
    body: await live.locator(".response-col_description pre").first().textContent(),
  };
}

/** The recorder's own check: a page of ``origin`` fetching a CDN URL is blocked, and the attempt recorded. */
async function probe(browser, origin) {
  const { context, offsite } = await cutOffContext(browser);
  const page = await context.newPage();
  await page.goto(`${origin}/healthz`, { waitUntil: "load", timeout: TIMEOUT_MS });
  const outcome = await page.evaluate(
    (url) => fetch(url, { mode: "no-cors" }).then(() => "loaded", (e) => `failed: ${e}`),
    PROBE_URL,
  );
  await context.close();
  return { url: PROBE_URL, outcome, recorded: offsite.find((o) => o.url === PROBE_URL) ?? null };
}

const { pages, outDir } = JSON.parse(process.argv[2]);
const browser = await chromium.launch({ executablePath: chromiumPath(), headless: true });
try {
  const results = [];
  for (const spec of pages) results.push(await render(browser, spec, outDir));
  const result = { pages: results, probe: await probe(browser, new URL(pages[0].url).origin) };
  process.stdout.write(`${JSON.stringify(result)}\n`);
} finally {
  await browser.close();
}
