// Who may use the fylr's API: scopes, bearer tokens (with rotation from a file), client
// certificates, and the config sections `auth` and `tls`.
export { ApiAccess } from "./access.js";
export { certificateNames, matchClientRules, type CertificateNames, type ClientRule } from "./client-certs.js";
export { apiAuthSchema, compileApiAuth, fylrTlsSchema, tokenEntrySchema, type ApiAuthConfig, type FylrTlsConfig } from "./config.js";
export { allows, queueProcedureScopes, scopes, type Scope } from "./scopes.js";
export { readServerTls } from "./tls-files.js";
export { tokenDigest, TokenSet, type Identity, type TokenEntry } from "./token-set.js";
export { ApiTokens, parseTokensFile, type ReloadOutcome } from "./tokens-file.js";
