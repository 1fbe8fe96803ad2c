// The playground: the server's own public API from a browser (no private route, no build step, no CDN).
// Every URL is relative to the page, so the page works behind a reverse proxy's path prefix.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = "whisper-server.api-key";
const LANGUAGES = ("en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th " +
  "ur hr bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si km sn yo so " +
  "af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha ba jw su yue").split(" ");
const STREAMABLE = new Set(["json", "text", "diarized_json"]);

const state = { file: null, result: null, raw: null, format: null, recorder: null, live: null, englishOnly: false };

// ---- the API --------------------------------------------------------------------------------------------------

function url(path) {
  return new URL(path, document.baseURI).href;
}

function apiKey() {
  return sessionStorage.getItem(KEY_STORAGE) || "";
}

function authHeaders() {
  const key = apiKey();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

async function errorMessage(response) {
  const body = await response.text();
  try {
    const parsed = JSON.parse(body);
    if (parsed.error && parsed.error.message) return parsed.error.message;
  } catch (_) { /* not JSON: the text itself */ }
  return body || `${response.status} ${response.statusText}`;
}

// ---- status and options ---------------------------------------------------------------------------------------

async function loadServer() {
  try {
    const health = await fetch(url("health"));
    const body = await health.json().catch(() => ({}));
    $("status").textContent = health.ok ? `ready: ${body.model}` : `not ready: ${(body.error || {}).message || health.status}`;
    const models = await fetch(url("v1/models"), { headers: authHeaders() });
    if (!models.ok) {
      if (models.status === 401) $("status").textContent += " (enter the API key under Options)";
      return;
    }
    const { data } = await models.json();
    $("model").replaceChildren(...data.map((m) => new Option(m.id, m.id)));
    if (data.length) offerWhatTheModelCan(data[0].id);
  } catch (e) {
    $("status").textContent = `cannot reach the server: ${e}`;
  }
}

// Whisper's English-only checkpoints are named `.en` (tiny.en, base.en, distil-small.en), and /v1/models lists the
// served model's own id first, then its aliases (whisper-1, ...) for the same model. An English-only model
// transcribes English only: no translation, no language detection, so the page does not offer them.
function offerWhatTheModelCan(modelId) {
  const englishOnly = /\.en$/i.test(modelId);
  state.englishOnly = englishOnly;
  const form = $("options");
  const translate = form.querySelector("input[name=task][value=translate]");
  translate.disabled = englishOnly;
  if (englishOnly && translate.checked) form.querySelector("input[name=task][value=transcribe]").checked = true;
  $("language").placeholder = englishOnly ? "en" : "detect";
  $("languages").replaceChildren(...(englishOnly ? ["en"] : LANGUAGES).map((code) => new Option(code)));
  const note = $("model-note");
  note.textContent = englishOnly
    ? `${modelId} is English-only: it transcribes English speech, and cannot translate or detect the language.`
    : "";
  note.hidden = !englishOnly;
}

// What an English-only model would refuse, said before anything is sent ("" when nothing).
function unsupported(o) {
  if (state.englishOnly && o.language && !["en", "english"].includes(o.language.toLowerCase())) {
    return `${$("model-note").textContent} Leave the language empty, or set it to en.`;
  }
  return "";
}

function options() {
  const form = $("options");
  return {
    model: $("model").value || "whisper-1",
    language: $("language").value.trim(),
    task: form.querySelector("input[name=task]:checked").value,
    format: $("response_format").value,
    granularities: [...form.querySelectorAll("input[name='timestamp_granularities[]']:checked")].map((c) => c.value),
    stream: $("stream").checked,
    chunking: $("chunking").checked,
    prompt: $("prompt").value.trim(),
    keywords: $("keywords").value.split(",").map((k) => k.trim()).filter(Boolean),
  };
}

// The form fields of a request, as [name, value] pairs (the file apart): what the page sends and the curl shows.
function fields(o) {
  const out = [["model", o.model], ["response_format", o.format]];
  if (o.prompt) out.push(["prompt", o.prompt]);
  if (o.task === "translate") return out; // translations take no language, timestamps or streaming
  if (o.language) out.push(["language", o.language]);
  if (o.format === "verbose_json") for (const g of o.granularities) out.push(["timestamp_granularities[]", g]);
  if (o.stream) out.push(["stream", "true"]);
  if (o.chunking) out.push(["chunking_strategy", "auto"]);
  for (const k of o.keywords) out.push(["keywords[]", k]);
  return out;
}

function endpoint(o) {
  return o.task === "translate" ? "v1/audio/translations" : "v1/audio/transcriptions";
}

// ---- audio in -------------------------------------------------------------------------------------------------

function setFile(file) {
  state.file = file;
  $("file-name").textContent = `${file.name} (${(file.size / 1024).toFixed(0)} KiB)`;
  const player = $("player");
  if (player.src) URL.revokeObjectURL(player.src);
  player.src = URL.createObjectURL(file);
  player.hidden = false;
  $("transcribe").disabled = false;
  $("curl").disabled = false;
}

function setUpInput() {
  const drop = $("drop");
  $("file").addEventListener("change", (e) => e.target.files[0] && setFile(e.target.files[0]));
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    if (e.dataTransfer.files[0]) setFile(e.dataTransfer.files[0]);
  });
  drop.addEventListener("keydown", (e) => {
    if ((e.key === "Enter" || e.key === " ") && e.target === drop) { e.preventDefault(); $("file").click(); }
  });
  $("record").addEventListener("click", toggleRecording);
}

async function toggleRecording() {
  const button = $("record");
  if (state.recorder) {
    state.recorder.stop();
    return;
  }
  let media;
  try {
    media = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (e) {
    return showError(`The microphone is not available: ${e.message}`);
  }
  const recorder = new MediaRecorder(media);
  const parts = [];
  recorder.ondataavailable = (e) => parts.push(e.data);
  recorder.onstop = () => {
    media.getTracks().forEach((t) => t.stop());
    const type = recorder.mimeType || "audio/webm";
    const extension = type.includes("ogg") ? "ogg" : type.includes("mp4") ? "m4a" : "webm";
    setFile(new File(parts, `recording.${extension}`, { type }));
    state.recorder = null;
    button.textContent = "Record";
    button.setAttribute("aria-pressed", "false");
  };
  recorder.start();
  state.recorder = recorder;
  button.textContent = "Stop recording";
  button.setAttribute("aria-pressed", "true");
}

// ---- transcribe -----------------------------------------------------------------------------------------------

async function transcribe() {
  if (!state.file) return;
  const o = options();
  clearResult();
  const refused = unsupported(o);
  if (refused) return showError(refused);
  const body = new FormData();
  body.append("file", state.file, state.file.name);
  for (const [name, value] of fields(o)) body.append(name, value);
  const button = $("transcribe");
  button.disabled = true;
  button.textContent = "Transcribing…";
  try {
    const response = await fetch(url(endpoint(o)), { method: "POST", headers: authHeaders(), body });
    if (!response.ok) return showError(await errorMessage(response));
    if (o.stream && o.task !== "translate") await readStream(response, o.format);
    else if (["json", "verbose_json", "diarized_json"].includes(o.format)) showResult(await response.json(), o.format);
    else showRaw(await response.text(), o.format);
  } catch (e) {
    showError(String(e));
  } finally {
    button.disabled = false;
    button.textContent = "Transcribe";
  }
}

// Server-sent events read off the response body: transcript.text.delta as they come, then transcript.text.done
// (diarized_json: transcript.text.segment per segment first).
async function readStream(response, format) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const transcript = $("transcript");
  const segments = [];
  let buffer = "";
  let deltas = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (!data || data === "[DONE]") continue;
      const event = JSON.parse(data);
      if (event.type === "transcript.text.delta") {
        transcript.append(document.createTextNode(event.delta));
        transcript.dataset.deltas = String(++deltas);
      } else if (event.type === "transcript.text.segment") {
        segments.push(event);
        showSegments(segments);
      } else if (event.type === "transcript.text.done") {
        showResult({ text: event.text, segments: segments.length ? segments : undefined, usage: event.usage },
          format, deltas);
      } else if (event.type === "error" || event.error) {
        showError((event.error || event).message || data);
      }
    }
  }
}

// ---- results --------------------------------------------------------------------------------------------------

function clearResult() {
  state.result = state.raw = null;
  $("error").hidden = true;
  $("transcript").replaceChildren();
  delete $("transcript").dataset.deltas;
  $("raw").hidden = true;
  $("segments").hidden = true;
  $("downloads").hidden = true;
}

// An error replaces the result: nothing is left to download.
function showError(message) {
  state.result = state.raw = null;
  $("downloads").hidden = true;
  const box = $("error");
  box.textContent = message;
  box.hidden = false;
}

function speakerOf(segment) {
  return segment.speaker ?? "";
}

function showResult(result, format, deltas) {
  state.result = result;
  state.format = format;
  const transcript = $("transcript");
  transcript.replaceChildren();
  if (deltas) transcript.dataset.deltas = String(deltas);
  if (Array.isArray(result.words) && result.words.length) {
    for (const w of result.words) {
      const span = document.createElement("span");
      span.className = "word";
      span.textContent = w.word;
      span.dataset.start = w.start;
      span.dataset.end = w.end;
      span.tabIndex = 0;
      span.setAttribute("role", "button");
      span.title = `${w.start.toFixed(2)} s`;
      transcript.append(span, " ");
    }
  } else if (format === "diarized_json" && result.segments) {
    for (const s of result.segments) {
      const line = document.createElement("p");
      const who = document.createElement("span");
      who.className = "speaker";
      who.textContent = `${speakerOf(s)}: `;
      line.append(who, s.text);
      transcript.append(line);
    }
  } else {
    transcript.textContent = result.text;
  }
  if (result.segments) showSegments(result.segments);
  $("downloads").hidden = false;
  for (const b of $("downloads").querySelectorAll("button")) {
    b.disabled = ["srt", "vtt"].includes(b.dataset.download) && !result.segments;
  }
}

function showRaw(text, format) {
  state.raw = text;
  state.format = format;
  state.result = null;
  $("raw").textContent = text;
  $("raw").hidden = false;
  $("downloads").hidden = false;
  for (const b of $("downloads").querySelectorAll("button")) {
    b.disabled = b.dataset.download !== (format === "text" ? "txt" : format);
  }
}

// The table's columns: start, end, text, and speaker (before the text) only when the result has speakers.
function showSegments(segments) {
  const columns = [["start", (s) => clock(s.start), "time"], ["end", (s) => clock(s.end), "time"]];
  if (segments.some((s) => speakerOf(s))) columns.push(["speaker", speakerOf, ""]);
  columns.push(["text", (s) => s.text.trim(), ""]);
  const table = $("segments");
  table.tHead.rows[0].replaceChildren(...columns.map(([name]) => {
    const th = document.createElement("th");
    th.scope = "col";
    th.textContent = name;
    return th;
  }));
  const rows = segments.map((s) => {
    const row = document.createElement("tr");
    for (const [, value, cls] of columns) {
      const cell = document.createElement("td");
      cell.textContent = value(s);
      if (cls) cell.className = cls;
      row.append(cell);
    }
    row.addEventListener("click", () => seek(s.start));
    return row;
  });
  table.tBodies[0].replaceChildren(...rows);
  table.hidden = false;
}

function clock(seconds) {
  const m = Math.floor(seconds / 60);
  return `${m}:${(seconds - 60 * m).toFixed(2).padStart(5, "0")}`;
}

// ---- the player and the words ---------------------------------------------------------------------------------

function seek(seconds) {
  const player = $("player");
  player.currentTime = seconds;
  highlight(seconds);
}

function highlight(t) {
  for (const span of $("transcript").querySelectorAll(".word")) {
    span.classList.toggle("spoken", Number(span.dataset.start) <= t && t < Number(span.dataset.end));
  }
}

function setUpPlayer() {
  const player = $("player");
  player.addEventListener("timeupdate", () => highlight(player.currentTime));
  const transcript = $("transcript");
  transcript.addEventListener("click", (e) => {
    if (e.target.classList.contains("word")) seek(Number(e.target.dataset.start));
  });
  transcript.addEventListener("keydown", (e) => {
    if ((e.key === "Enter" || e.key === " ") && e.target.classList.contains("word")) {
      e.preventDefault();
      seek(Number(e.target.dataset.start));
    }
  });
}

// ---- downloads and curl ---------------------------------------------------------------------------------------

function timestamp(seconds, separator) {
  const ms = Math.round(seconds * 1000);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${pad(Math.floor(ms / 3600000))}:${pad(Math.floor(ms / 60000) % 60)}:${pad(Math.floor(ms / 1000) % 60)}` +
    `${separator}${pad(ms % 1000, 3)}`;
}

function subtitles(segments, kind) {
  const sep = kind === "srt" ? "," : ".";
  const cues = segments.map((s, i) => {
    const who = speakerOf(s) ? `${speakerOf(s)}: ` : "";
    const head = kind === "srt" ? `${i + 1}\n` : "";
    return `${head}${timestamp(s.start, sep)} --> ${timestamp(s.end, sep)}\n${who}${s.text.trim()}\n`;
  });
  return (kind === "vtt" ? "WEBVTT\n\n" : "") + cues.join("\n");
}

function download(kind) {
  const base = (state.file ? state.file.name.replace(/\.[^.]+$/, "") : "transcript");
  let text;
  if (state.raw !== null) text = state.raw;
  else if (kind === "txt") text = state.result.text;
  else if (kind === "json") text = JSON.stringify(state.result, null, 2);
  else text = subtitles(state.result.segments, kind);
  const link = document.createElement("a");
  link.href = URL.createObjectURL(new Blob([text], { type: "text/plain;charset=utf-8" }));
  link.download = `${base}.${kind}`;
  document.body.append(link);
  link.click();
  link.remove();
}

function quote(value) {
  return `'${String(value).replace(/'/g, "'\\''")}'`;
}

function curlCommand() {
  const o = options();
  const lines = [`curl ${url(endpoint(o))}`];
  if (apiKey()) lines.push(`-H "Authorization: Bearer $WHISPER_API_KEY"`);
  lines.push(`-F file=@${quote(state.file ? state.file.name : "audio.flac")}`);
  for (const [name, value] of fields(o)) lines.push(`-F ${quote(`${name}=${value}`)}`);
  if (o.stream && o.task !== "translate") lines.push("--no-buffer");
  return lines.join(" \\\n  ");
}

async function copyCurl() {
  const command = curlCommand();
  const shown = $("curl-command");
  shown.textContent = command;
  shown.hidden = false;
  try {
    await navigator.clipboard.writeText(command);
    $("curl").textContent = "Copied";
    setTimeout(() => { $("curl").textContent = "Copy curl command"; }, 1500);
  } catch (_) { /* no clipboard (an insecure origin): the command is shown to copy by hand */ }
}

// ---- live: the Realtime API from the microphone, over WebRTC --------------------------------------------------

// As an app on a phone would: a one-use client secret is minted first (the page's own API key, if the server has
// keys, stays in this page's requests to the server's API and never opens the call), then the call is set up with
// that secret alone: the SDP offer posted, the microphone on an Opus track, the events on the oai-events channel.
async function mintSecret(session) {
  const response = await fetch(url("v1/realtime/client_secrets"), {
    method: "POST",
    headers: { ...authHeaders(), "Content-Type": "application/json" },
    body: JSON.stringify({ expires_after: { anchor: "created_at", seconds: 60 }, session }),
  });
  if (!response.ok) throw new Error(await errorMessage(response));
  return (await response.json()).value;
}

// The offer with the candidates this browser gathered (no trickle: the server answers the whole offer at once);
// on one machine or a flat network its host addresses are enough, and they come within milliseconds.
function gathered(pc) {
  return new Promise((resolve) => {
    if (pc.iceGatheringState === "complete") return resolve();
    const done = () => { if (pc.iceGatheringState === "complete") resolve(); };
    pc.addEventListener("icegatheringstatechange", done);
    setTimeout(resolve, 2000);
  });
}

async function startLive() {
  clearResult();
  const o = options();
  const refused = unsupported(o);
  if (refused) return showError(refused);
  const transcription = { model: o.model };
  if (o.language) transcription.language = o.language;
  if (o.prompt) transcription.prompt = o.prompt;
  let media;
  try {
    media = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: true } });
  } catch (e) {
    return showError(`The microphone is not available: ${e.message}`);
  }
  const pc = new RTCPeerConnection();
  const live = { pc, media, finals: new Map(), partials: new Map(), order: [] };
  state.live = live;
  $("live").textContent = "Stop live";
  $("live").setAttribute("aria-pressed", "true");
  try {
    const secret = await mintSecret({ type: "transcription", audio: { input: { transcription } } });
    for (const track of media.getAudioTracks()) pc.addTrack(track, media);
    const channel = pc.createDataChannel("oai-events");
    channel.onmessage = (message) => onLiveEvent(live, JSON.parse(message.data));
    channel.onclose = () => {
      if (state.live !== live) return;
      stopLive();
      if (!$("error").textContent) showError("The live session ended.");
    };
    await pc.setLocalDescription(await pc.createOffer());
    await gathered(pc);
    const answer = await fetch(url("v1/realtime/calls"), {
      method: "POST",
      headers: { Authorization: `Bearer ${secret}`, "Content-Type": "application/sdp" },
      body: pc.localDescription.sdp,
    });
    if (!answer.ok) throw new Error(await errorMessage(answer));
    live.callId = (answer.headers.get("Location") || "").split("/").pop();
    await pc.setRemoteDescription({ type: "answer", sdp: await answer.text() });
  } catch (e) {
    if (state.live === live) stopLive();
    showError(`The live session could not start: ${e.message}`);
  }
}

function onLiveEvent(live, event) {
  const id = event.item_id;
  if (id && !live.order.includes(id)) live.order.push(id);
  if (event.type === "conversation.item.input_audio_transcription.delta") {
    live.partials.set(id, (live.partials.get(id) || "") + event.delta);
    live.deltas = (live.deltas || 0) + 1;
  } else if (event.type === "conversation.item.input_audio_transcription.completed") {
    live.partials.delete(id);
    live.finals.set(id, event.transcript);
  } else if (event.type === "error") {
    showError(event.error.message);
  }
  renderLive(live);
}

function renderLive(live) {
  const transcript = $("transcript");
  transcript.replaceChildren();
  for (const id of live.order) {
    if (live.finals.has(id)) transcript.append(live.finals.get(id), " ");
    else if (live.partials.has(id)) {
      const span = document.createElement("span");
      span.className = "partial";
      span.textContent = live.partials.get(id);
      transcript.append(span, " ");
    }
  }
  transcript.dataset.turns = String(live.finals.size);
  transcript.dataset.deltas = String(live.deltas || 0);
}

function stopLive() {
  const live = state.live;
  if (!live) return;
  state.live = null;
  live.media.getTracks().forEach((t) => t.stop());
  live.pc.close(); // the server sees the call end, and frees its session
  $("live").textContent = "Live from the microphone";
  $("live").setAttribute("aria-pressed", "false");
}

// ---- start ----------------------------------------------------------------------------------------------------

function setUpKey() {
  const input = $("api_key");
  input.value = apiKey();
  input.addEventListener("change", () => {
    if (input.value) sessionStorage.setItem(KEY_STORAGE, input.value.trim());
    else sessionStorage.removeItem(KEY_STORAGE);
    loadServer();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  $("languages").replaceChildren(...LANGUAGES.map((code) => new Option(code)));
  setUpKey();
  setUpInput();
  setUpPlayer();
  $("transcribe").addEventListener("click", transcribe);
  $("curl").addEventListener("click", copyCurl);
  $("live").addEventListener("click", () => (state.live ? stopLive() : startLive()));
  for (const b of $("downloads").querySelectorAll("button")) b.addEventListener("click", () => download(b.dataset.download));
  $("stream").addEventListener("change", () => {
    if ($("stream").checked && !STREAMABLE.has($("response_format").value)) $("response_format").value = "json";
  });
  loadServer();
});
