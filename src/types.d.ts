// Files imported `with { type: "file" }` resolve to a path (embedded in dist/kvedge).
declare module "*.so" {
  const path: string;
  export default path;
}
declare module "*.jsonl" {
  const path: string;
  export default path;
}
