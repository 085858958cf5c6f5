// Plugins: shared libraries that add architectures at run time (include/kaon_plugin.h is their
// side; kaon.h's kaon_plugin_load loads one).
#ifndef KAON_MODEL_PLUGIN_H
#define KAON_MODEL_PLUGIN_H

// Loads each plugin of a colon-separated list ($KAON_PLUGINS), in order; empty entries are
// skipped. 0, or -1 + the first failure's error.
int kaon_plugin_load_list(const char *paths);

#endif
