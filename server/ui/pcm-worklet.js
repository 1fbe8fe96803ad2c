// The microphone as the Realtime API's input: 24 kHz mono 16-bit PCM in 100 ms messages. The page asks for a
// 24 kHz AudioContext; where the browser gives another rate (`sampleRate` here), samples are interpolated.
"use strict";

const RATE = 24000;
const CHUNK = RATE / 10;

class PCM16 extends AudioWorkletProcessor {
  constructor() {
    super();
    this.step = sampleRate / RATE; // input samples per output sample
    this.position = 0; // where the next output sample falls, in input samples from the block's start
    this.last = 0; // the previous block's last sample
    this.out = new Int16Array(CHUNK);
    this.filled = 0;
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true;
    while (this.position < channel.length) {
      const i = Math.floor(this.position);
      const frac = this.position - i;
      const before = i === 0 ? this.last : channel[i - 1];
      const sample = Math.max(-1, Math.min(1, before + (channel[i] - before) * frac));
      this.out[this.filled++] = sample < 0 ? sample * 0x8000 : sample * 0x7fff;
      if (this.filled === CHUNK) {
        this.port.postMessage(this.out.buffer.slice(0));
        this.filled = 0;
      }
      this.position += this.step;
    }
    this.position -= channel.length;
    this.last = channel[channel.length - 1];
    return true;
  }
}

registerProcessor("pcm16", PCM16);
