// Stream reads a Server-Sent Events stream over fetch, so that it can
// notice silence (EventSource hides the server's keep-alive comments): any
// byte, keep-alive comments included, re-arms a watchdog, and a stream
// silent for longer than silenceMs is dropped and reopened. Every reopen
// sends Last-Event-ID, so the registry API resumes where the page stopped
// (or answers with a fresh snapshot when it cannot).

export class Stream {
  // onEvent(type, data, id) gets each dispatched event; onState(state)
  // gets {state: 'connecting'|'open'|'retrying', error, retryAt, attempt}.
  constructor(url, { silenceMs, onEvent, onState }) {
    this.url = url;
    this.silenceMs = silenceMs;
    this.onEvent = onEvent;
    this.onState = onState;
    this.lastEventId = '';
    this.retryMs = 1000;
    this.maxRetryMs = 15000;
    this.stopped = true;
    this.ctrl = null;
    this.wake = null;
    this.attempt = 0;
  }

  start() {
    if (!this.stopped) return;
    this.stopped = false;
    this.loop();
  }

  stop() {
    this.stopped = true;
    this.ctrl?.abort(new Error('stopped'));
    this.wake?.();
  }

  // retryNow ends the wait before the next attempt.
  retryNow() {
    this.wake?.();
  }

  async loop() {
    while (!this.stopped) {
      try {
        await this.once();
        throw new Error('the server ended the stream');
      } catch (err) {
        if (this.stopped) return;
        this.attempt += 1;
        const base = Math.min(this.retryMs * 2 ** Math.min(this.attempt - 1, 6), this.maxRetryMs);
        const delay = Math.round(base * (0.75 + Math.random() * 0.25));
        this.onState({ state: 'retrying', error: describe(err), retryAt: Date.now() + delay, attempt: this.attempt });
        await new Promise((resolve) => {
          const t = setTimeout(resolve, delay);
          this.wake = () => {
            clearTimeout(t);
            resolve();
          };
        });
        this.wake = null;
      }
    }
  }

  async once() {
    const ctrl = new AbortController();
    this.ctrl = ctrl;
    let timer = 0;
    const arm = () => {
      clearTimeout(timer);
      timer = setTimeout(() => ctrl.abort(new SilenceError(this.silenceMs)), this.silenceMs);
    };
    arm();
    this.onState({ state: 'connecting', attempt: this.attempt });
    try {
      const headers = { Accept: 'text/event-stream' };
      if (this.lastEventId) headers['Last-Event-ID'] = this.lastEventId;
      const resp = await fetch(this.url, { headers, signal: ctrl.signal, cache: 'no-store' });
      if (!resp.ok) {
        let msg = `HTTP ${resp.status}`;
        try {
          const body = await resp.json();
          if (body && body.message) msg += `: ${body.message}`;
        } catch {
          // not a JSON error body
        }
        throw new Error(msg);
      }
      const ct = resp.headers.get('Content-Type') || '';
      if (!ct.startsWith('text/event-stream')) throw new Error(`unexpected content type ${ct || '(none)'}`);
      this.onState({ state: 'open', attempt: this.attempt });
      const parser = new Parser((type, data, id) => {
        this.attempt = 0;
        this.onEvent(type, data, id);
      });
      parser.onRetry = (ms) => {
        this.retryMs = ms;
      };
      parser.onId = (id) => {
        this.lastEventId = id;
      };
      const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
      try {
        for (;;) {
          const { value, done } = await reader.read();
          if (done) return;
          arm();
          parser.push(value);
        }
      } finally {
        reader.cancel().catch(() => {});
      }
    } catch (err) {
      // An abort reports its reason (silence, stop) rather than AbortError.
      if (ctrl.signal.aborted && ctrl.signal.reason) throw ctrl.signal.reason;
      throw err;
    } finally {
      clearTimeout(timer);
    }
  }
}

export class SilenceError extends Error {
  constructor(ms) {
    super(`no data for ${Math.round(ms / 1000)} s (not even a keep-alive)`);
    this.name = 'SilenceError';
  }
}

function describe(err) {
  if (!err) return 'unknown error';
  if (err instanceof TypeError) return `the server is unreachable (${err.message})`;
  return err.message || String(err);
}

// Parser implements the event-stream format: lines ending in \n (a
// trailing \r is dropped), fields event, data, id and retry, comments
// starting with ':', and a blank line dispatching the event. It scans each
// byte once, however a long data line is split across chunks.
export class Parser {
  constructor(dispatch) {
    this.dispatch = dispatch;
    this.buf = '';
    this.scanned = 0;
    this.type = '';
    this.data = [];
    this.id = null;
    this.onRetry = () => {};
    this.onId = () => {};
  }

  push(chunk) {
    this.buf += chunk;
    let start = 0;
    let nl = this.buf.indexOf('\n', this.scanned);
    while (nl >= 0) {
      let line = this.buf.slice(start, nl);
      if (line.endsWith('\r')) line = line.slice(0, -1);
      this.line(line);
      start = nl + 1;
      nl = this.buf.indexOf('\n', start);
    }
    this.buf = this.buf.slice(start);
    this.scanned = this.buf.length;
  }

  line(line) {
    if (line === '') {
      // As the spec says, the last event ID changes when an event is
      // dispatched, not when its id field is read.
      const id = this.id;
      if (id !== null) this.onId(id);
      this.id = null;
      if (this.data.length > 0) {
        this.dispatch(this.type || 'message', this.data.join('\n'), id);
      }
      this.type = '';
      this.data = [];
      return;
    }
    if (line.startsWith(':')) return;
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    switch (field) {
      case 'event':
        this.type = value;
        break;
      case 'data':
        this.data.push(value);
        break;
      case 'id':
        if (!value.includes('\0')) this.id = value;
        break;
      case 'retry':
        if (/^\d+$/.test(value)) this.onRetry(Number(value));
        break;
      default:
        break;
    }
  }
}
