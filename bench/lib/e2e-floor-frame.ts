// Frames of the end-to-end bench's floor (e2e-floor-app.ts → e2e-floor-exec.ts), carried
// on a raw grpc-js bidi stream with identity serializers (no protobuf):
//   job:    u32 job id, u8 command (an index into floorCommands), stdin bytes
//   result: u32 job id, u8 exit code (255: killed by a signal), stdout bytes

/** Method path of the floor's stream. */
export const floorExecPath = "/bench.FloorExec/Run";

/** The command byte → argv: the same commands as the bench's two services. */
export const floorCommands = [["true"], ["sha256sum"]] as const;

export function jobFrame(id: number, command: number, stdin: Buffer): Buffer {
  const frame = Buffer.allocUnsafe(5 + stdin.length);
  frame.writeUInt32BE(id, 0);
  frame[4] = command;
  stdin.copy(frame, 5);
  return frame;
}
