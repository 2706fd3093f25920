/* sched_csv.c: schedules as CSV files: one row per rank, one action per
 * cell, an empty cell is idle. Reads our notation and both of PyTorch's
 * (detected per file), writes ours or PyTorch's newer one. */
#include "sched/sched.h"
#include "sched/sched_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A file has at most as many rows (ranks) as a generated schedule has
 * ranks (--stages); stages and microbatches at most CSV_MAX_INDEX + 1. */
#define CSV_MAX_RANKS 1024
#define CSV_MAX_INDEX 100000

/* Raw op letters as written in a file, before the notation is known. */
enum { RAW_F, RAW_I, RAW_B, RAW_W, RAW_BW };

typedef struct cell {
    int row, slot; /* rank and grid column after expansion */
    int stage, raw, mb;
} cell;

typedef struct reader {
    const char *what;
    cell *cells;
    int n, cap;
    int row_slots; /* slots used so far on the current row */
} reader;

static int add_cell(reader *rd, int row, int stage, int raw, int mb, pp_err *err) {
    if (rd->n == rd->cap) {
        int cap = rd->cap ? rd->cap * 2 : 256;
        cell *c = realloc(rd->cells, sizeof *c * (size_t)cap);
        if (!c) return pp_fail(err, "%s: out of memory", rd->what);
        rd->cells = c;
        rd->cap = cap;
    }
    rd->cells[rd->n++] = (cell){row, rd->row_slots++, stage, raw, mb};
    return 0;
}

/* One action token: {stage}{F|I|B|W|BW}{mb}. Returns 1 when it is one of
 * PyTorch's communication or resharding actions (no cell for us), 0 for
 * a compute action, -1 when it is not an action, -2 when it is one whose
 * stage or microbatch is over CSV_MAX_INDEX. */
static int parse_token(const char *t, int *stage, int *raw, int *mb) {
    static const char *const comm_ops[] = {"SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD"};
    const char *p = t;
    long s = 0, b = 0;
    int big = 0; /* saturate rather than stop, so the rest of the token is still checked */
    if (*p < '0' || *p > '9') return -1;
    while (*p >= '0' && *p <= '9')
        if ((s = s * 10 + (*p++ - '0')) > CSV_MAX_INDEX) s = CSV_MAX_INDEX + 1, big = 1;
    for (size_t i = 0; i < sizeof comm_ops / sizeof comm_ops[0]; i++) {
        size_t n = strlen(comm_ops[i]);
        if (strncmp(p, comm_ops[i], n) == 0) {
            const char *q = p + n;
            while (*q >= '0' && *q <= '9') q++;
            return *q ? -1 : 1;
        }
    }
    if (p[0] == 'B' && p[1] == 'W') *raw = RAW_BW, p += 2;
    else if (*p == 'F') *raw = RAW_F, p++;
    else if (*p == 'I') *raw = RAW_I, p++;
    else if (*p == 'B') *raw = RAW_B, p++;
    else if (*p == 'W') *raw = RAW_W, p++;
    else return -1;
    if (*p < '0' || *p > '9') return -1;
    while (*p >= '0' && *p <= '9')
        if ((b = b * 10 + (*p++ - '0')) > CSV_MAX_INDEX) b = CSV_MAX_INDEX + 1, big = 1;
    if (*p) return -1;
    if (big) return -2;
    *stage = (int)s;
    *mb = (int)b;
    return 0;
}

static int bad_cell(reader *rd, int line, int col, const char *text, int kind, pp_err *err) {
    if (kind == -2)
        return pp_fail(err, "%s: line %d, column %d: cell '%.60s': a stage or microbatch over %d", rd->what, line,
                       col, text, CSV_MAX_INDEX);
    return pp_fail(err,
                   "%s: line %d, column %d: cell '%.60s' is not an action; expected {stage}{op}{microbatch} with op "
                   "F, B, W (pprun), I, W, B (PyTorch) or BW (older PyTorch), e.g. 0F3, or an empty cell for idle",
                   rd->what, line, col, text);
}

/* One cell's text (unquoted, trimmed). */
static int read_cell(reader *rd, int row, int line, int col, char *text, pp_err *err) {
    int stage, raw, mb, k;
    if (!*text) {
        rd->row_slots++;
        return 0;
    }
    char *ov = strstr(text, "OVERLAP_F_B");
    if (ov) {
        /* PyTorch's compound cell "(0F1;1B0)OVERLAP_F_B": a forward and a
         * backward it overlaps; here they run one after the other. */
        char *open = strchr(text, '('), *close = strrchr(text, ')');
        if (!open || !close || close < open || close > ov) return bad_cell(rd, line, col, text, -1, err);
        *close = '\0';
        int any = 0;
        char *save = NULL;
        for (char *t = strtok_r(open + 1, ";, ", &save); t; t = strtok_r(NULL, ";, ", &save)) {
            k = parse_token(t, &stage, &raw, &mb);
            if (k < 0) return bad_cell(rd, line, col, t, k, err);
            if (k == 0 && add_cell(rd, row, stage, raw, mb, err) != 0) return -1;
            any = 1;
        }
        if (!any) return bad_cell(rd, line, col, text, -1, err);
        return 0;
    }
    k = parse_token(text, &stage, &raw, &mb);
    if (k < 0) return bad_cell(rd, line, col, text, k, err);
    if (k == 1) {
        rd->row_slots++;
        return 0;
    }
    return add_cell(rd, row, stage, raw, mb, err);
}

static void trim(char **s) {
    while (**s == ' ' || **s == '\t') (*s)++;
    size_t n = strlen(*s);
    while (n > 0 && ((*s)[n - 1] == ' ' || (*s)[n - 1] == '\t')) (*s)[--n] = '\0';
}

int sched_parse_csv(const char *text, size_t len, const char *what, sched_plan **out, pp_err *err) {
    *out = NULL;
    reader rd = {what, NULL, 0, 0, 0};
    char *cellbuf = malloc(len + 1);
    int *row_slots = NULL;
    int rows = 0, row_cap = 0, rc = -1, line = 1, col = 1;
    size_t i = 0;
    if (!cellbuf) return pp_fail(err, "%s: out of memory", what);
    /* A text file has no NUL byte: cells would end at it and silently drop
     * what follows. */
    const char *nul = memchr(text, '\0', len);
    if (nul) {
        for (const char *q = text; q < nul; q++) line += *q == '\n';
        pp_fail(err, "%s: line %d: a NUL byte; expected a text file with one row per rank", what, line);
        goto done;
    }
    /* A UTF-8 byte order mark (spreadsheets write one) is not part of a cell. */
    if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0) i = 3;
    /* Rows: every line, but trailing blank lines are not ranks. */
    size_t end = len;
    while (end > i && (text[end - 1] == '\n' || text[end - 1] == '\r' || text[end - 1] == ' ' || text[end - 1] == '\t'))
        end--;
    if (end == i) {
        pp_fail(err, "%s: no rows; expected one row per rank with actions like 0F3", what);
        goto done;
    }
    while (i <= end) {
        /* one cell */
        size_t n = 0;
        int quoted = 0;
        if (i < end && text[i] == '"') {
            quoted = 1;
            i++;
            for (;;) {
                if (i >= end) {
                    pp_fail(err, "%s: line %d, column %d: unterminated quoted cell", what, line, col);
                    goto done;
                }
                if (text[i] == '"') {
                    if (i + 1 < end && text[i + 1] == '"') {
                        cellbuf[n++] = '"';
                        i += 2;
                        continue;
                    }
                    i++;
                    break;
                }
                cellbuf[n++] = text[i++];
            }
        }
        while (i < end && text[i] != ',' && text[i] != '\n' && text[i] != '\r') {
            if (quoted && text[i] != ' ' && text[i] != '\t') {
                pp_fail(err, "%s: line %d, column %d: text after a quoted cell", what, line, col);
                goto done;
            }
            cellbuf[n++] = text[i++];
        }
        cellbuf[n] = '\0';
        char *c = cellbuf;
        trim(&c);
        if (rows == 0 || rows <= line - 1) {
            if (line > CSV_MAX_RANKS) {
                pp_fail(err, "%s: line %d: more than %d rows; a schedule has at most %d ranks, one row each", what,
                        line, CSV_MAX_RANKS, CSV_MAX_RANKS);
                goto done;
            }
            if (line > row_cap) { /* doubling: one row at a time is quadratic */
                int cap = row_cap ? 2 * row_cap : 64;
                int *rs = realloc(row_slots, sizeof(int) * (size_t)cap);
                if (!rs) {
                    pp_fail(err, "%s: out of memory", what);
                    goto done;
                }
                row_slots = rs;
                row_cap = cap;
            }
            row_slots[line - 1] = 0;
            rows = line;
        }
        if (read_cell(&rd, line - 1, line, col, c, err) != 0) goto done;
        if (i >= end) {
            row_slots[line - 1] = rd.row_slots;
            break;
        }
        if (text[i] == ',') {
            i++;
            col++;
            continue;
        }
        /* end of line */
        row_slots[line - 1] = rd.row_slots;
        if (text[i] == '\r' && i + 1 < end && text[i + 1] == '\n') i++;
        i++;
        line++;
        col = 1;
        rd.row_slots = 0;
        if (i > end) break;
    }
    if (rd.n == 0) {
        pp_fail(err, "%s: no actions in %d rows; expected actions like 0F3", what, rows);
        goto done;
    }

    /* Which notation? A file with I is PyTorch's newer one (B = full
     * backward). Without I, a B and a W of the same (stage, mb) mean B is
     * the input gradient (ours, PyTorch's older one, where BW is full). A
     * file with only F and B has full backwards. */
    int S = 0, m = 0, has_i = 0, split = 0;
    for (int k = 0; k < rd.n; k++) {
        if (rd.cells[k].stage + 1 > S) S = rd.cells[k].stage + 1;
        if (rd.cells[k].mb + 1 > m) m = rd.cells[k].mb + 1;
        has_i |= rd.cells[k].raw == RAW_I;
    }
    if ((long)S * m * 3 > 10000000L) {
        pp_fail(err, "%s: %d stages x %d microbatches x 3 ops is over 10 million actions", what, S, m);
        goto done;
    }
    if (!has_i) {
        unsigned char *seen = calloc((size_t)S * (size_t)m, 1);
        if (!seen) {
            pp_fail(err, "%s: out of memory", what);
            goto done;
        }
        for (int k = 0; k < rd.n; k++) {
            size_t key = (size_t)rd.cells[k].stage * (size_t)m + (size_t)rd.cells[k].mb;
            if (rd.cells[k].raw == RAW_B) seen[key] |= 1;
            if (rd.cells[k].raw == RAW_W) seen[key] |= 2;
        }
        for (size_t k = 0; k < (size_t)S * (size_t)m && !split; k++) split = seen[k] == 3;
        free(seen);
    }
    int full_b = has_i || !split; /* does a bare B mean B then W? */

    /* Expand into rows: a full backward takes two cells (B, W). */
    int p = rows, v = (S + p - 1) / p;
    int *lens = calloc((size_t)p, sizeof(int)), *stage_rank = malloc(sizeof(int) * (size_t)S);
    sched_action **lists = calloc((size_t)p, sizeof *lists);
    sched_plan *plan = NULL;
    if (!lens || !stage_rank || !lists) goto oom;
    /* each rank's list holds its own cells, a full backward two actions:
     * one list of every cell per rank would be ranks x cells */
    for (int k = 0; k < rd.n; k++) lens[rd.cells[k].row] += 2;
    for (int r = 0; r < p; r++)
        if (!lens[r]) {
            /* a blank line inside the file would otherwise be a rank that runs nothing */
            pp_fail(err, "%s: line %d: no actions; every row is a rank and needs at least one action", what, r + 1);
            goto fail;
        }
    for (int r = 0; r < p; r++) {
        if (!(lists[r] = malloc(sizeof(sched_action) * (size_t)(lens[r] ? lens[r] : 1)))) goto oom;
        lens[r] = 0;
    }
    for (int s = 0; s < S; s++) stage_rank[s] = -1;
    int *shift = calloc((size_t)p, sizeof(int)), nslots = 0;
    if (!shift) goto oom;
    for (int r = 0; r < p; r++) nslots = row_slots[r] > nslots ? row_slots[r] : nslots;
    /* grid: slot of each cell, shifted right on its row by earlier expansions */
    sched_action **slots = calloc((size_t)p, sizeof *slots);
    if (!slots) {
        free(shift);
        goto oom;
    }
    int extra = 0;
    for (int k = 0; k < rd.n; k++) {
        int raw = rd.cells[k].raw;
        extra += (raw == RAW_BW || (raw == RAW_B && full_b));
    }
    nslots += extra;
    for (int r = 0; r < p; r++) {
        if (!(slots[r] = malloc(sizeof(sched_action) * (size_t)(nslots > 0 ? nslots : 1)))) {
            for (int q = 0; q < r; q++) free(slots[q]);
            free(slots);
            free(shift);
            goto oom;
        }
        for (int c = 0; c < nslots; c++) slots[r][c] = (sched_action){-1, 0, 0};
    }
    int used = 0;
    /* A stage lives on the rank that runs most of its actions; the
     * validator then names any stray action elsewhere. */
    int *count = calloc((size_t)S * (size_t)p, sizeof(int));
    if (!count) {
        for (int r = 0; r < p; r++) free(slots[r]);
        free(slots);
        free(shift);
        goto oom;
    }
    for (int k = 0; k < rd.n; k++) count[(size_t)rd.cells[k].stage * (size_t)p + (size_t)rd.cells[k].row]++;
    for (int s = 0; s < S; s++)
        for (int r = 0; r < p; r++)
            if (count[(size_t)s * (size_t)p + (size_t)r] > 0 &&
                (stage_rank[s] < 0 || count[(size_t)s * (size_t)p + (size_t)r] >
                                          count[(size_t)s * (size_t)p + (size_t)stage_rank[s]]))
                stage_rank[s] = r;
    free(count);
    for (int k = 0; k < rd.n; k++) {
        const cell *c = &rd.cells[k];
        int r = c->row, raw = c->raw;
        int ops[2], nops = 0;
        if (raw == RAW_F) ops[nops++] = SCHED_F;
        else if (raw == RAW_I) ops[nops++] = SCHED_B;
        else if (raw == RAW_W) ops[nops++] = SCHED_W;
        else if (raw == RAW_BW || full_b) ops[nops++] = SCHED_B, ops[nops++] = SCHED_W;
        else ops[nops++] = SCHED_B;
        for (int j = 0; j < nops; j++) {
            sched_action a = {c->stage, ops[j], c->mb};
            lists[r][lens[r]++] = a;
            int slot = c->slot + shift[r] + j;
            slots[r][slot] = a;
            if (slot + 1 > used) used = slot + 1;
        }
        shift[r] += nops - 1;
    }
    free(shift);
    char name[64];
    snprintf(name, sizeof name, "csv:%s", what);
    rc = sched_plan_from_lists(name, p, S, v, m, stage_rank, lists, lens, &plan, err);
    if (rc == 0) {
        /* The file's own grid, with its idle cells, replaces the simulated one. */
        for (int r = 0; r < p; r++) {
            free(plan->slots[r]);
            plan->slots[r] = slots[r];
        }
        plan->nslots = used;
        *out = plan;
    } else {
        for (int r = 0; r < p; r++) free(slots[r]);
    }
    free(slots);
    for (int r = 0; r < p; r++) free(lists[r]);
    free(lists);
    free(lens);
    free(stage_rank);
    goto done;
oom:
    pp_fail(err, "%s: out of memory", what);
fail:
    if (lists)
        for (int r = 0; r < p; r++) free(lists[r]);
    free(lists);
    free(lens);
    free(stage_rank);
    rc = -1;
done:
    free(rd.cells);
    free(cellbuf);
    free(row_slots);
    return rc;
}

int sched_load_csv(const char *path, sched_plan **out, pp_err *err) {
    *out = NULL;
    char *buf;
    size_t len;
    if (pp_read_file(path, 64u << 20, "schedule CSV", &buf, &len, err) != 0) return -1;
    int rc = sched_parse_csv(buf, len, path, out, err);
    free(buf);
    return rc;
}

int sched_write_csv(const sched_plan *plan, const char *path, const char *notation, pp_err *err) {
    int torch = 0;
    if (!notation || strcmp(notation, "pprun") == 0) torch = 0;
    else if (strcmp(notation, "pytorch") == 0) torch = 1;
    else return pp_fail(err, "--notation: unknown notation '%s'; accepted: pprun, pytorch", notation);
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return pp_fail(err, "schedule CSV %s: path too long", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return pp_fail(err, "schedule CSV %s: cannot create %s: %m", path, tmp);
    for (int r = 0; r < plan->ranks; r++) {
        /* trailing idle cells are left out: a row ends with its last action */
        int last = plan->nslots - 1;
        while (last >= 0 && plan->slots[r][last].stage < 0) last--;
        for (int c = 0; c <= last; c++) {
            const sched_action *a = &plan->slots[r][c];
            if (c) fputc(',', f);
            if (a->stage < 0) continue;
            fprintf(f, "%d%c%d", a->stage, torch ? "FIW"[a->op] : "FBW"[a->op], a->mb);
        }
        fputc('\n', f);
    }
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        remove(tmp);
        return pp_fail(err, "schedule CSV %s: write error (disk full?)", path);
    }
    if (rename(tmp, path) != 0) {
        remove(tmp);
        return pp_fail(err, "schedule CSV %s: cannot rename %s into place: %m", path, tmp);
    }
    return 0;
}
