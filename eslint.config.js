// Type-aware lint: floating promises, import cycles and the import boundaries between the
// parts of src/ are errors.
import js from "@eslint/js";
import tseslint from "typescript-eslint";
import { createNodeResolver, importX } from "eslint-plugin-import-x";

// The three engines are peers: each imports only src/shared and gen/. The queue API sits on
// the dispatcher, the status pages only draw data, and src/app joins everything.
const parts = ["execserver", "fylr", "dispatcher", "api", "status-pages", "app", "commands"];
const engineMayUse = { execserver: [], fylr: [], dispatcher: [], api: ["dispatcher"], "status-pages": [], app: parts.filter((p) => p !== "commands" && p !== "app") };
const zone = (target, allowed, message) => ({
  target: `./src/${target}`,
  from: parts.filter((p) => p !== target && !allowed.includes(p)).map((p) => `./src/${p}`),
  message,
});
const boundaries = [
  { target: "./src/shared", from: parts.map((p) => `./src/${p}`), message: "src/shared is the bottom layer: it imports only gen/ and libraries." },
  ...Object.entries(engineMayUse).map(([target, allowed]) =>
    zone(target, allowed, `src/${target} may import only src/shared, gen/${allowed.length ? ` and src/${allowed.join(", src/")}` : ""}; joining code belongs in src/app.`),
  ),
  // An exec host never loads database code: not directly, not through the shared pg helpers.
  {
    target: ["./src/execserver", "./src/fylr", "./src/status-pages", "./src/app/execserver.ts", "./src/commands/execserver.ts"],
    from: ["./src/shared/postgres.ts", "./src/shared/embedded-postgres.ts", "./src/shared/postgres-binaries.ts"],
    message: "database code stays out of the execserver and the broker client.",
  },
  // A client command starts in about half the CPU when it loads no server code.
  {
    target: ["./src/commands/api-options.ts", "./src/commands/control.ts", "./src/commands/list.ts", "./src/commands/output.ts", "./src/commands/show.ts", "./src/commands/status.ts", "./src/commands/status-tables.ts", "./src/commands/submit.ts", "./src/commands/submit-args.ts", "./src/commands/submit-input.ts", "./src/commands/submit-progress.ts"],
    from: ["./src/dispatcher", "./src/execserver", "./src/status-pages", "./src/api/index.ts", "./src/app/index.ts", "./src/app/local-stack.ts", "./src/app/fylr.ts", "./src/fylr/index.ts"],
    message: "client commands import the client modules they use (src/api/client.ts, store-client.ts, timeline.ts, src/app/up-state.ts), not server code or barrels that load it.",
  },
  {
    target: ["./src/app/execserver.ts", "./src/commands/execserver.ts"],
    from: ["./src/dispatcher", "./src/api", "./src/app/index.ts", "./src/app/fylr.ts", "./src/app/local-stack.ts"],
    message: "the exec host's entry must not load the dispatcher (and with it pg).",
  },
];

export default tseslint.config(
  { ignores: ["gen/**", "node_modules/**", "tools/**", "load/scripts/**", "load/results/**", "bench/results/**", "scratch/**", "**/*.js"] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    plugins: { "import-x": importX },
    // Imports name the emitted ".js"; the sources are ".ts" (NodeNext resolution).
    // import-x must parse .ts dependencies to follow cycles through them.
    settings: {
      "import-x/resolver-next": [createNodeResolver({ extensions: [".ts", ".js", ".json", ".node"], extensionAlias: { ".js": [".ts", ".js"] } })],
      "import-x/extensions": [".ts", ".js"],
      "import-x/parsers": { "@typescript-eslint/parser": [".ts"] },
    },
    rules: {
      "@typescript-eslint/no-floating-promises": "error",
      "@typescript-eslint/no-misused-promises": ["error", { checksVoidReturn: { arguments: false } }],
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
      "@typescript-eslint/consistent-type-imports": "error",
      "import-x/no-cycle": "error",
      "import-x/no-restricted-paths": ["error", { zones: boundaries }],
    },
  },
  {
    // pg is database code: only the dispatcher, the shared pg helpers and the fylr's assembly load it.
    files: ["src/execserver/**/*.ts", "src/fylr/**/*.ts", "src/status-pages/**/*.ts", "src/api/**/*.ts", "src/app/execserver.ts", "src/commands/execserver.ts"],
    rules: {
      "no-restricted-imports": [
        "error",
        {
          paths: [
            { name: "pg", message: "database code stays in src/dispatcher (and the fylr's assembly)." },
            { name: "pg-copy-streams", message: "database code stays in src/dispatcher." },
          ],
          patterns: ["@embedded-postgres/*"],
        },
      ],
    },
  },
  {
    files: ["test/**/*.ts", "bench/**/*.ts", "load/**/*.ts"],
    rules: {
      "@typescript-eslint/no-unused-expressions": "off",
      "@typescript-eslint/no-non-null-assertion": "off",
    },
  },
);
