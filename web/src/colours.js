// Link colours by utilisation: grey when idle, then blue -> green -> yellow -> red as the link fills
// (d3's Turbo scale: saturated at every step, so a half-full link stays visible on white).
import { interpolateTurbo } from "d3-scale-chromatic";

export const IDLE = "#b9c2cc";

export function utilColour(ratio) {
  if (ratio === null || ratio === undefined || ratio < 0) return IDLE;
  if (ratio < 0.005) return IDLE;
  const t = Math.min(1, ratio);
  return interpolateTurbo(0.12 + 0.85 * t);
}

export function percent(ratio) {
  if (ratio === null || ratio === undefined || ratio < 0) return "–";
  return `${(ratio * 100).toFixed(ratio < 0.1 ? 1 : 0)} %`;
}
