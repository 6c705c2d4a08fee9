export {
  ConfigError,
  type ConfigSources,
  configFlagSpecs,
  type LoadedConfig,
  loadConfig,
  parseConfigText,
} from "./load";
export { configurationDoc, flagHelp, renderConfig, settingsTable } from "./render";
export { type Config, CONFIG_FLAG, envName, SETTINGS, type Setting, WORKERS_FLAG } from "./schema";
export { formatCpuList } from "./values";
export { checkEndpoint, type WorkerEntry, workersFromText } from "./workers";
