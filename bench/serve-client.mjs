// serve-client.mjs -- the one client bench/serve.sh runs against both
// servers: C concurrent streaming completions of N tokens each (ignore_eos,
// greedy, the same prompt per client index), node's http module only.
// Prints one JSON line: per client ttft_ms and tokens; decode_tok_s, the
// aggregate decode rate while every client is decoding (chunks that arrive
// between the last client's first token and the first client's end, over
// that time: prompts excluded, as llama-bench's tg excludes pp); and
// overall_tok_s = sum of (tokens - 1) / (last end - first first-token).
//   node serve-client.mjs BASE_URL CLIENTS TOKENS
import http from 'node:http';
const [base, cArg, nArg] = process.argv.slice(2);
const C = +cArg, N = +nArg, url = new URL(base);

function one(i) {
    return new Promise((resolve, reject) => {
        const body = JSON.stringify({ prompt: 'Once upon a time, in a land far away, there lived a ' + ['king', 'cat', 'girl', 'wizard', 'dog', 'queen', 'boy', 'bird'][i % 8],
                                      max_tokens: N, n_predict: N, ignore_eos: true, temperature: 0, stream: true,
                                      stream_options: { include_usage: true } });
        const t0 = performance.now();
        let first = null, chunks = 0, usage = null, buf = '';
        const times = [];
        const req = http.request({ host: url.hostname, port: url.port, path: '/v1/completions', method: 'POST',
                                   headers: { 'Content-Type': 'application/json' } }, (res) => {
            res.setEncoding('utf8');
            res.on('data', (d) => {
                buf += d;
                let k;
                while ((k = buf.indexOf('\n\n')) >= 0) {
                    const ev = buf.slice(0, k); buf = buf.slice(k + 2);
                    if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
                    const j = JSON.parse(ev.slice(6));
                    if (j.usage) usage = j.usage;
                    if (j.choices && j.choices.length && j.choices[0].text) {
                        if (first === null) first = performance.now();
                        times.push(performance.now());
                        chunks++;
                    }
                }
            });
            res.on('end', () => resolve({ t0, first, end: performance.now(), tokens: usage ? usage.completion_tokens : chunks, times }));
        });
        req.on('error', reject);
        req.end(body);
    });
}
const t = performance.now();
const r = await Promise.all(Array.from({ length: C }, (_, i) => one(i)));
const firstMin = Math.min(...r.map((x) => x.first)), endMax = Math.max(...r.map((x) => x.end));
const decoded = r.reduce((s, x) => s + x.tokens - 1, 0);
const lastFirst = Math.max(...r.map((x) => x.first)), firstEnd = Math.min(...r.map((x) => x.times[x.times.length - 1]));
const inWindow = r.reduce((s, x) => s + x.times.filter((t) => t > lastFirst && t <= firstEnd).length, 0);
console.log(JSON.stringify({
    clients: C, tokens: r.map((x) => x.tokens), ttft_ms: r.map((x) => +(x.first - x.t0).toFixed(1)),
    decode_tok_s: +(inWindow / ((firstEnd - lastFirst) / 1000)).toFixed(3),
    overall_tok_s: +(decoded / ((endMax - firstMin) / 1000)).toFixed(3), wall_s: +((endMax - t) / 1000).toFixed(2) }));
