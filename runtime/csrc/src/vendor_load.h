/* vendor_load.h: what vendor_blas.cu and vendor_dnn.cu share to load an NVIDIA library at run
 * time (CUDA build only): the first soname of a list the process can dlopen, unless
 * GRAPHC_CUDA_LIBS=0, and its entry points by name. Header-only; no state.
 */
#ifndef GRAPHC_RT_VENDOR_LOAD_H
#define GRAPHC_RT_VENDOR_LOAD_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace gc_vendor {

/* dlopens the first of names[0..count) that loads; on success returns its handle and sets
 * *opened to its name. Otherwise returns NULL with `status` saying why in a sentence naming
 * `library` ("cuBLAS") and what then runs `work` ("every GEMM"). */
inline void *open_first(const char *const *names, int count, const char *library,
                        const char *work, char *status, size_t status_size,
                        const char **opened) {
    const char *setting = getenv("GRAPHC_CUDA_LIBS");
    if (setting && strcmp(setting, "0") == 0) {
        snprintf(status, status_size, "%s not used: GRAPHC_CUDA_LIBS=0 forces graphc's kernels",
                 library);
        return nullptr;
    }
    const char *why = "";
    for (int i = 0; i < count; ++i) {
        void *handle = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (handle) {
            *opened = names[i];
            return handle;
        }
        why = dlerror();
    }
    snprintf(status, status_size, "%s not found (%s): graphc's kernels run %s", library,
             why ? why : "", work);
    return nullptr;
}

/* the address of `name` in `library`; NULL (and *missing = true) when it lacks it */
inline void *symbol(void *library, const char *name, bool *missing) {
    void *p = dlsym(library, name);
    if (!p) *missing = true;
    return p;
}

} /* namespace gc_vendor */

#endif /* GRAPHC_RT_VENDOR_LOAD_H */
