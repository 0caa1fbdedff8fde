// load.mjs -- load and faults for `sparrow serve` (issue 17, acceptance 3),
// with node's own http module (no packages): C clients x N requests each in
// a bounded loop; a third of the streams are cut by the client after their
// first chunk, and malformed JSON and oversized bodies are mixed in (they
// must get 400 and 413).  First, four streams at once: every first chunk
// must arrive before any [DONE].  Prints the time to first token of the
// streams that ran to the end and writes them (ms, one a line) to TTFT_FILE.
//   node load.mjs BASE_URL CLIENTS REQUESTS MAX_TOKENS TTFT_FILE [--no-concurrency]
import http from 'node:http';
import fs from 'node:fs';

const [base, clientsArg, requestsArg, maxTokArg, ttftFile, flag] = process.argv.slice(2);
const C = +clientsArg, N = +requestsArg, MAXTOK = +maxTokArg;
const url = new URL(base);
const agent = new http.Agent({ keepAlive: false, maxSockets: 64 });
let failures = 0;
const fail = (m) => { failures++; console.error('FAIL: ' + m); };

function post(path, body, opts = {}) {
    return new Promise((resolve) => {
        const t0 = performance.now();
        const req = http.request({ host: url.hostname, port: url.port, path, method: 'POST', agent,
                                   headers: { 'Content-Type': 'application/json' }, timeout: 60000 }, (res) => {
            let data = '', first = null, cut = false;
            res.setEncoding('utf8');
            res.on('data', (d) => {
                if (first === null && d.includes('"content"') ) first = performance.now() - t0;
                if (first === null && d.includes('"text"')) first = performance.now() - t0;
                data += d;
                if (opts.cutAfterFirst && first !== null && !cut) { cut = true; req.destroy(); resolve({ status: res.statusCode, cut: true }); }
            });
            res.on('end', () => resolve({ status: res.statusCode, data, ttft: first, t: performance.now() - t0 }));
            res.on('error', () => { if (!cut) resolve({ status: res.statusCode, error: true }); });
        });
        req.on('error', (e) => { if (!opts.cutAfterFirst) resolve({ status: 0, error: e.message }); else resolve({ status: 0, cut: true }); });
        req.on('timeout', () => { req.destroy(); resolve({ status: 0, error: 'timeout' }); });
        req.end(body);
    });
}

function chatBody(i, stream, n = MAXTOK) {
    return JSON.stringify({ messages: [{ role: 'user', content: 'Tell me story number ' + i }], max_tokens: n,
                            ignore_eos: true, temperature: 0.8, seed: i, stream });
}

// ---- four at once ----------------------------------------------------------------------------
if (flag !== '--no-concurrency') {
    const t0 = performance.now();
    const firsts = [], dones = [];
    await Promise.all([0, 1, 2, 3].map(async (i) => {
        const r = await post('/v1/chat/completions', chatBody(100 + i, true, Math.max(MAXTOK, 160)));
        if (r.status !== 200 || !r.data.endsWith('data: [DONE]\n\n')) fail('concurrent stream ' + i + ': ' + r.status);
        firsts[i] = r.ttft + 0; dones[i] = r.t;
    }));
    const ok = Math.max(...firsts) < Math.min(...dones);
    (ok ? console.log : fail)('four streams at once: first chunks at ' + firsts.map((x) => x.toFixed(0)) +
                              ' ms, [DONE] at ' + dones.map((x) => x.toFixed(0)) + ' ms');
    void t0;
}

// ---- the loop --------------------------------------------------------------------------------------
const ttfts = [];
const counts = { done: 0, cut: 0, malformed: 0, oversized: 0, plain: 0 };
const big = '{"prompt": "' + 'a'.repeat(2 << 20) + '"}';
await Promise.all(Array.from({ length: C }, async (_, c) => {
    for (let i = 0; i < N; i++) {
        const k = (c + i) % 3;
        if (i % 3 === 1) {
            const r = await post('/v1/chat/completions', '{"messages": [{"role": "user", "content": "x"}');
            if (r.status !== 400) fail('malformed JSON: status ' + r.status); else counts.malformed++;
        }
        if (i % 3 === 2) {
            const r = await post('/v1/completions', big);
            if (r.status !== 413 && r.status !== 0) fail('oversized body: status ' + r.status); else counts.oversized++;
        }
        if (k === 2) {
            const r = await post('/v1/chat/completions', chatBody(c * 1000 + i, true), { cutAfterFirst: true });
            if (!r.cut) fail('cut stream: it ended by itself (' + r.status + ')'); else counts.cut++;
        } else if (k === 1 && i % 2) {
            const r = await post('/v1/completions', JSON.stringify({ prompt: 'Once upon a time ' + c, max_tokens: MAXTOK,
                                                                     ignore_eos: true }));
            if (r.status !== 200 || !JSON.parse(r.data).choices) fail('completion: ' + r.status); else counts.plain++;
        } else {
            const r = await post('/v1/chat/completions', chatBody(c * 1000 + i, true));
            if (r.status !== 200 || !r.data.endsWith('data: [DONE]\n\n')) fail('stream: ' + r.status + ' ' + (r.error || ''));
            else { counts.done++; ttfts.push(r.ttft); }
        }
    }
}));
ttfts.sort((a, b) => a - b);
const pct = (p) => ttfts.length ? ttfts[Math.min(ttfts.length - 1, Math.floor(p * ttfts.length))] : NaN;
console.log(`load: ${C} clients x ${N} requests: ${counts.done} streams done, ${counts.cut} cut mid-stream, ` +
            `${counts.plain} completions, ${counts.malformed} malformed (400), ${counts.oversized} oversized (413); ` +
            `ttft p50 ${pct(0.5).toFixed(1)} ms, p99 ${pct(0.99).toFixed(1)} ms`);
if (ttftFile) fs.appendFileSync(ttftFile, ttfts.map((x) => x.toFixed(2)).join('\n') + (ttfts.length ? '\n' : ''));
process.exit(failures ? 1 : 0);
