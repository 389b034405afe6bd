/* test_store, every reader's gets through the staging ring that serves CUDA targets
 * (WSYNC_STORE_STAGE=1, schemes/store_stage.c) with 64 KiB slots, so that the ring goes round
 * and carries the store's byte checks, late joiners and lost senders on a machine without a GPU.
 * (The copies out of the ring are host memcpy here; on a GPU, cudaMemcpy2DAsync.) */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(void)
{
    const char *bin = WSYNC_BIN_DIR "/../tests/test_store";

    if (setenv("WSYNC_STORE_STAGE", "1", 1) != 0 || setenv("WSYNC_STORE_STAGE_KB", "64", 1) != 0) {
        perror("setenv");
        return 1;
    }
    execl(bin, bin, (char *)NULL);
    fprintf(stderr, "test_store_staged: cannot run %s (build the test_store target)\n", bin);
    return 1;
}
