/* zt_layout.c — being written */
