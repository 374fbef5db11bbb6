#!/bin/sh
# placeholder
exit 77
