/**
 * Headless Chromium for the status page tests: a tracked browser, pages that record script
 * errors, and a temp directory for screenshots.
 */
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type Browser, type Page } from "playwright-core";
import { closeLater } from "../../execserver/support/broker-stream.js";
import { track } from "../../../harness/resources.js";
import { requireTool } from "../../../harness/system-tools.js";

// Background networking off: on a closed network Chromium would keep trying to reach Google.
const chromiumArgs = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

/** Launches Debian's Chromium (SLOTBROKER_CHROMIUM overrides the path); close with `release`. */
export async function launchBrowser(): Promise<Browser> {
  const browser = await chromium.launch({ executablePath: requireTool("chromium"), args: chromiumArgs });
  return track(browser, "chromium", (b) => b.close());
}

/** A page plus every script error and failed request it saw. */
export interface WatchedPage {
  readonly page: Page;
  readonly errors: string[];
}

/**
 * Opens `url` in a fresh context (1280 px wide), answering HTTP auth challenges with
 * `httpCredentials` when given, as a user typing them would; closed by `releaseAll` (or
 * `release(page.context())`).
 */
export async function openPage(browser: Browser, url: string, httpCredentials?: { username: string; password: string }): Promise<WatchedPage> {
  const options = { viewport: { width: 1280, height: 900 }, colorScheme: "light" as const, ...(httpCredentials && { httpCredentials }) };
  const context = closeLater(track(await browser.newContext(options), `page ${url}`, (c) => c.close()));
  const page = await context.newPage();
  const errors: string[] = [];
  page.on("pageerror", (err) => errors.push(`page error: ${err.message}`));
  page.on("console", (msg) => {
    if (msg.type() === "error") errors.push(`console: ${msg.text()}`);
  });
  page.on("dialog", (dialog) => {
    errors.push(`dialog: ${dialog.message()}`);
    void dialog.dismiss();
  });
  const response = await page.goto(url);
  if (!response?.ok()) throw new Error(`GET ${url}: ${response?.status() ?? "no response"}`);
  return { page, errors };
}

/** Where screenshots go (one temp directory per run; the path is printed). */
export const screenshotDir = mkdtempSync(join(tmpdir(), "slotbroker-status-page-"));

/** Saves a full-page screenshot and returns its path. */
export async function screenshot(page: Page, name: string): Promise<string> {
  const path = join(screenshotDir, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  if (process.env.SLOTBROKER_SHOW_SCREENSHOTS) console.log(`    screenshot: ${path}`);
  return path;
}
