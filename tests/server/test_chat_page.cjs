// h2o-server's chat page in a real browser: Debian's Chromium, headless, driven by puppeteer-core.
// Loads /, sends a message and sees the reply stream in, stops a reply, finds the conversation
// after a reload and after a restart of the server, shows hostile text as text, deletes the
// conversation, and checks that the page made no console error and fetched nothing but the
// server's own URLs. A screenshot is checked not to be blank (and written to $H2O_PAGE_SCREENSHOT
// when set: docs/chat-page.png is made so).
// Usage: node test_chat_page.cjs H2O_SERVER MODEL NODE_MODULES
'use strict';
const { spawn } = require('child_process');
const fs = require('fs');
const os = require('os');
const path = require('path');

const [server, model, modules] = process.argv.slice(2);
const skip = (why) => { console.log(`H2O-SKIP: ${why}`); process.exit(0); };
const chromium = process.env.H2O_CHROMIUM || '/usr/bin/chromium';
if (!fs.existsSync(model)) skip(`no model at ${model}`);
if (!fs.existsSync(chromium)) skip(`no Chromium at ${chromium} (Debian: apt-get install chromium)`);
let puppeteer;
try {
  puppeteer = require(path.resolve(modules, 'puppeteer-core'));
} catch (error) {
  skip(`puppeteer-core is not installed in ${modules} (scripts/test.sh installs it)`);
}

const stateDir = fs.mkdtempSync(path.join(process.env.H2O_TEST_TMPDIR || os.tmpdir(), 'h2o-page-'));
let child = null;

// Starts h2o-server (port 0: any free one; a restart asks for the same) and resolves with its URL.
function startServer(port) {
  return new Promise((resolve, reject) => {
    // Long replies (up to 4096 tokens, a few seconds) leave time to press stop while one streams.
    child = spawn(server, ['-m', model, '--chat-format', 'zephyr', '--port', String(port), '-t', '1', '-n', '4096',
                           '--state-dir', stateDir], { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    child.stderr.on('data', (data) => {
      log += data;
      const found = /listening on (http:\/\/[\d.]+:(\d+))/.exec(log);
      if (found) resolve({ url: found[1], port: Number(found[2]) });
    });
    child.on('exit', (code) => reject(new Error(`h2o-server ended (${code}) before listening:\n${log}`)));
  });
}

function stopServer() {
  return new Promise((resolve) => {
    child.removeAllListeners('exit');
    child.on('exit', resolve);
    child.kill('SIGTERM');
  });
}

function check(condition, message) {
  if (!condition) throw new Error(message);
}

// Whether a PNG screenshot shows something: decoded by the browser in a page of its own, at
// least 1% of its pixels differ from the most common colour.
async function notBlank(browser, png) {
  const page = await browser.newPage();
  const share = await page.evaluate(async (data) => {
    const image = new Image();
    image.src = 'data:image/png;base64,' + data;
    await image.decode();
    const canvas = document.createElement('canvas');
    canvas.width = image.width;
    canvas.height = image.height;
    const context = canvas.getContext('2d');
    context.drawImage(image, 0, 0);
    const pixels = context.getImageData(0, 0, image.width, image.height).data;
    const counts = new Map();
    for (let i = 0; i < pixels.length; i += 4) {
      const key = (pixels[i] << 16) | (pixels[i + 1] << 8) | pixels[i + 2];
      counts.set(key, (counts.get(key) || 0) + 1);
    }
    return 1 - Math.max(...counts.values()) / (pixels.length / 4);
  }, Buffer.from(png).toString('base64'));
  await page.close();
  return share;
}

async function main() {
  let { url, port } = await startServer(0);
  const browser = await puppeteer.launch({
    executablePath: chromium, headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'],
  });
  try {
    const page = await browser.newPage();
    await page.setViewport({ width: 1100, height: 700 });
    const problems = [];
    page.on('console', (m) => { if (m.type() === 'error') problems.push(`console: ${m.text()}`); });
    page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
    page.on('request', (r) => {
      if (!r.url().startsWith(url + '/') && !r.url().startsWith('data:')) problems.push(`a request elsewhere: ${r.url()}`);
    });
    const text = (selector) => page.$eval(selector, (e) => e.textContent);
    const titles = () => page.$$eval('#conversations li button.open', (l) => l.map((b) => b.textContent));
    const replyDone = () => page.waitForSelector('#stop', { hidden: true, timeout: 60000 });

    await page.goto(url + '/', { waitUntil: 'load' });
    await page.waitForFunction(() => document.getElementById('status').textContent.includes('model stories260K'));
    console.log(`loaded: status "${await text('#status')}"`);

    // A message and its reply, streamed: text appears while the stop button shows.
    await page.type('#input', 'Tell me a story');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => {
      const replies = document.querySelectorAll('.message.assistant .text');
      return replies.length === 1 && replies[0].textContent.length > 0 && !document.getElementById('stop').hidden;
    }, { timeout: 30000 });
    console.log('streaming: text appeared while the reply was running');
    await replyDone();
    const first = await text('.message.assistant .text');
    check(first.length > 20, `the first reply: ${JSON.stringify(first)}`);
    check(/tokens\/s/.test(await text('#status')), `no rate in the status: ${await text('#status')}`);
    check(JSON.stringify(await titles()) === '["Tell me a story"]', `the list: ${JSON.stringify(await titles())}`);

    // Stop: the reply ends early, and the server saw its client leave (and cancelled).
    const goneBefore = (await (await fetch(url + '/health')).json()).requests.client_gone;
    await page.type('#input', 'And then?');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => {
      const replies = document.querySelectorAll('.message.assistant .text');
      return replies.length === 2 && replies[1].textContent.length > 0;
    }, { timeout: 30000 });
    await page.click('#stop');
    await replyDone();
    check((await text('#status')).includes('stopped'), `after stop: ${await text('#status')}`);
    for (let i = 0; i < 100; ++i) {
      const health = await (await fetch(url + '/health')).json();
      if (health.requests.client_gone > goneBefore && health.requests.in_flight === 0) break;
      await new Promise((r) => setTimeout(r, 100));
      check(i < 99, 'the server never saw the stopped reply\'s client leave');
    }
    console.log('stop: the reply ended early and the server cancelled it');

    // A reload finds the conversation, opened where it was (its messages from the server).
    await page.reload({ waitUntil: 'load' });
    await page.waitForFunction(() => document.querySelectorAll('.message.user').length === 2, { timeout: 10000 });
    check(JSON.stringify(await titles()) === '["Tell me a story"]', `after reload: ${JSON.stringify(await titles())}`);
    check((await text('.message.assistant .text')) === first, 'after reload the first reply differs');
    console.log('reload: the conversation and its messages are back');

    // A restart of the server (same port, same state directory) too.
    await stopServer();
    ({ url, port } = await startServer(port));
    await page.reload({ waitUntil: 'load' });
    await page.waitForFunction(() => document.querySelectorAll('.message.user').length === 2, { timeout: 10000 });
    check(JSON.stringify(await titles()) === '["Tell me a story"]', `after restart: ${JSON.stringify(await titles())}`);
    console.log('restart: the conversation and its messages are back');

    // The conversation goes on after the restart: its session comes back from the snapshot.
    await page.type('#input', 'The end');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => document.querySelectorAll('.message.assistant').length === 3, { timeout: 30000 });
    await replyDone();
    const listed = (await (await fetch(url + '/v1/conversations')).json()).data;
    check(listed.length === 1 && listed[0].turns === 3, `after a third turn: ${JSON.stringify(listed)}`);

    const png = await page.screenshot({ type: 'png' });
    const share = await notBlank(browser, png);
    check(share > 0.01, `the screenshot is blank (${(share * 100).toFixed(2)}% of its pixels differ)`);
    console.log(`screenshot: ${(share * 100).toFixed(1)}% of its pixels differ from the background`);
    if (process.env.H2O_PAGE_SCREENSHOT) fs.writeFileSync(process.env.H2O_PAGE_SCREENSHOT, png);

    // Hostile text in a conversation's messages and title (as a model's output would be) shows as text.
    const hostile = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>';
    const made = await (await fetch(url + '/v1/chat/completions', {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'stories260K', max_tokens: 4, messages: [
        { role: 'user', content: hostile }, { role: 'assistant', content: hostile }, { role: 'user', content: 'ok' }] }),
    })).json();
    await page.reload({ waitUntil: 'load' });
    await page.waitForFunction((n) => document.querySelectorAll('#conversations li').length === n, {}, 2);
    await page.click(`#conversations li[data-id="${made.conversation_id}"] button.open`);
    await page.waitForFunction((h) => {
      const replies = document.querySelectorAll('.message.assistant .text');
      return replies.length === 2 && replies[0].textContent === h;
    }, { timeout: 10000 }, hostile);
    check((await titles()).some((t) => t.startsWith('<img src=x')), `the hostile title: ${JSON.stringify(await titles())}`);
    check(await page.$$eval('#messages img, #messages script, #conversations img', (l) => l.length) === 0,
          'hostile markup became elements');
    check(await page.evaluate(() => window.__pwned) === undefined, 'hostile markup ran');
    console.log('hostile text: shown as text, nothing ran');

    // Delete both: the list empties, the server forgets them and their files go.
    for (const id of [made.conversation_id, listed[0].id]) {
      await page.click(`#conversations li[data-id="${id}"] button.delete`);
      await page.waitForFunction((gone) => !document.querySelector(`#conversations li[data-id="${gone}"]`), {}, id);
    }
    check((await (await fetch(url + '/v1/conversations')).json()).data.length === 0, 'the server still lists a conversation');
    check(fs.readdirSync(stateDir).length === 0, `files left: ${fs.readdirSync(stateDir)}`);
    console.log('delete: the list is empty and the state directory too');

    check(problems.length === 0, problems.join('\n'));
    console.log('no console errors, no requests elsewhere');
  } finally {
    await browser.close();
    await stopServer();
    fs.rmSync(stateDir, { recursive: true, force: true });
  }
}

main().catch((error) => {
  console.error(`FAILED: ${error.stack || error}`);
  if (child) child.kill('SIGKILL');
  process.exit(1);
});
