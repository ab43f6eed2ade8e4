/*
 * The store's files by path, for tools: where a session's file is, and the
 * files of sessions/ that no index entry names, each with whether it would
 * be adopted. Nothing here changes the store.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "index.h"
#include "platform.h"
#include "syscall.h"

int ctxs_store_session_get_path(char *buf, size_t size, const char *dir, uint64_t id)
{
    ctxs__error_begin();
    if (!buf || !size)
        return CTXS_EINVAL;
    char name[32];
    ctxs__file_name(name, id);
    int n = snprintf(buf, size, "%s%ssessions/%s", dir ? dir : "", dir ? "/" : "", name);
    if (n < 0 || (size_t)n >= size) {
        buf[0] = '\0';
        return -ENAMETOOLONG;
    }
    return 0;
}

static int indexed(const ctxs_session_entry *known, size_t n, uint64_t id)
{
    for (size_t i = 0; i < n; i++)
        if (known[i].id == id)
            return 1;
    return 0;
}

/* Fills f for the file name (id) at path: its kind, its blocks, and
 * whether it opens with a current record. */
static void file_fill(ctxs_store_file *f, const char *name, uint64_t id, const char *path)
{
    memset(f, 0, sizeof(*f));
    snprintf(f->file, sizeof(f->file), "%s", name);
    f->id = id;
    struct stat sb;
    if (ctxs__fstatat(AT_FDCWD, path, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode)) {
        f->regular = 1;
        f->disk_bytes = (uint64_t)sb.st_blocks * 512u;
    }
    ctxs_file_report rep;
    int rc = ctxs_file_inspect(&rep, path);
    int current = 0;
    for (int i = 0; rc == 0 && i < 2; i++)
        current |= rep.records[i].status == 0 && rep.records[i].current;
    f->status = rc < 0 ? rc : rep.status < 0 ? rep.status : current ? 0 : CTXS_ECORRUPT;
}

int ctxs_store_file_list(ctxs_store_file **out, size_t *n_out, const char *dir, ctxs_store *st)
{
    ctxs__error_begin();
    if (!out || !n_out)
        return CTXS_EINVAL;
    *out = NULL;
    *n_out = 0;
    if (!dir)
        return CTXS_EINVAL;
    ctxs_session_entry *known = NULL;
    size_t n_known = 0;
    if (st) {
        int rc = ctxs_store_session_list(&known, &n_known, st);
        if (rc < 0)
            return rc;
    }
    char *sessions = ctxs__path_join(dir, "sessions");
    if (!sessions) {
        free(known);
        return CTXS_ENOMEM;
    }
    int fd = ctxs__open(sessions, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? ctxs__fdopendir(fd) : NULL;
    int rc = 0;
    if (!d) {
        rc = errno == ENOENT ? 0 : -errno;
        if (fd >= 0)
            close(fd);
        free(sessions);
        free(known);
        return rc;
    }
    ctxs_store_file *list = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while (rc == 0 && (errno = 0, de = ctxs__readdir(d))) {
        uint64_t id;
        if (!ctxs__file_name_id(de->d_name, &id) || indexed(known, n_known, id))
            continue;
        if ((rc = ctxs__array_room((void **)&list, &cap, n, sizeof(*list), 8)) < 0)
            break;
        char *path = ctxs__path_join(sessions, de->d_name);
        if (!path) {
            rc = CTXS_ENOMEM;
            break;
        }
        file_fill(&list[n++], de->d_name, id, path);
        free(path);
    }
    if (rc == 0 && errno != 0)
        rc = -errno;
    closedir(d);
    free(sessions);
    free(known);
    if (rc < 0) {
        free(list);
        return rc;
    }
    *out = list;
    *n_out = n;
    return 0;
}
