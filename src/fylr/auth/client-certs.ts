import type { Identity } from "./token-set.js";
import type { Scope } from "./scopes.js";

/** Maps a verified client certificate to scopes. */
export interface ClientRule {
  /** A name the certificate carries: its subject CN or a subjectAltName value (DNS, URI, email, IP). */
  readonly subject: string;
  readonly scopes: readonly Scope[];
}

/** The parts of a peer certificate (node:tls `PeerCertificate`) the rules look at. */
export interface CertificateNames {
  readonly subject?: { readonly CN?: string | string[] } | null;
  /** e.g. `DNS:ops.example.com, IP Address:10.0.0.5, URI:spiffe://example/ops`. */
  readonly subjectaltname?: string;
}

/** The names a certificate carries: its subject CNs and subjectAltName values. Pure. */
export function certificateNames(cert: CertificateNames): string[] {
  const cn = cert.subject?.CN;
  const names = cn === undefined ? [] : Array.isArray(cn) ? [...cn] : [cn];
  for (const part of splitAltNames(cert.subjectaltname ?? "")) {
    const colon = part.indexOf(":");
    if (colon > 0) names.push(unquote(part.slice(colon + 1)));
  }
  return names;
}

/** The identity of a verified certificate: the first rule whose subject it carries. */
export function matchClientRules(rules: readonly ClientRule[], cert: CertificateNames): Identity | undefined {
  const names = new Set(certificateNames(cert));
  const rule = rules.find((r) => names.has(r.subject));
  return rule && { name: rule.subject, via: "certificate", scopes: new Set(rule.scopes) };
}

/** How a certificate is named in a refusal: its CN, else its first alternative name. */
export function describeCertificate(cert: CertificateNames): string {
  const cn = cert.subject?.CN;
  const first = Array.isArray(cn) ? cn[0] : cn;
  if (first) return `CN=${first}`;
  return certificateNames(cert)[0] ?? "(no names)";
}

// Node quotes a value that holds a comma or a quote as a JSON string ("DNS:\"a, b\"").
function splitAltNames(text: string): string[] {
  const parts: string[] = [];
  let current = "";
  let quoted = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!;
    if (c === '"' && text[i - 1] !== "\\") quoted = !quoted;
    if (c === "," && !quoted) {
      parts.push(current.trim());
      current = "";
      continue;
    }
    current += c;
  }
  if (current.trim()) parts.push(current.trim());
  return parts;
}

function unquote(value: string): string {
  if (!value.startsWith('"')) return value;
  try {
    return JSON.parse(value) as string;
  } catch {
    return value;
  }
}
