// Shared by the Node test suites (tests/acp, tests/console): no packages needed.
import { StringDecoder } from "node:string_decoder";

/** The child's stdout as it arrives, split into lines (a last unterminated line too, at its end). */
export function stdoutLines(child) {
  const lines = [];
  const decoder = new StringDecoder("utf8");
  let pending = "";
  child.stdout.on("data", (chunk) => {
    const parts = (pending + decoder.write(chunk)).split("\n");
    pending = parts.pop();
    lines.push(...parts);
  });
  child.stdout.on("end", () => {
    if (pending) lines.push(pending);
  });
  return lines;
}
