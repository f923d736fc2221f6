/*
 * failingspare: a zygote on the C SDK whose spares all fail their rehearsal
 * (on_spare returns non-zero): fiberd must give up on spares after a few and
 * fork every Clone. Each fiber answers HTTP with "fence=<fence>". For
 * TestSparesGiveUp, beside testdata/failingspare.py.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fiberzygote.h"

static int on_fiber(const struct fz_fiber *f, void *arg)
{
	(void)arg;
	for (;;) {
		int c = accept(FZ_LISTEN_FD, NULL, NULL);
		if (c < 0)
			return 1;
		char req[4096], body[256], out[512];
		if (read(c, req, sizeof(req)) < 0) { /* answered anyway */ }
		int bl = snprintf(body, sizeof(body), "fence=%s\n", f->fence);
		int ol = snprintf(out, sizeof(out), "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", bl,
				  body);
		if (write(c, out, (size_t)ol) < 0) { /* the client went away */ }
		close(c);
	}
}

static int rehearse(void *arg)
{
	(void)arg;
	fprintf(stderr, "failingspare: this template's rehearsal always fails\n");
	return 1;
}

int main(void)
{
	return fz_serve_spares(FZ_CONTROL_FD, on_fiber, rehearse, NULL) < 0 ? 2 : 0;
}
